//go:build !linux

package main

import (
	"crypto/tls"
	"net"
)

// quietSocket is quietconn_linux.go's; elsewhere sockets stay standard.
func quietSocket(nc net.Conn) net.Conn { return nc }

// socketOf is the socket under nc (under TLS).
func socketOf(nc net.Conn) net.Conn {
	if tc, ok := nc.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return nc
}
