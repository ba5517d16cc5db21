package main

// How a broker's sessions reach the database.

import (
	"context"
	"net"
	"time"
)

// pgKeepAlive finds a dead peer in seconds rather than hours, on both
// ends of every connection: the broker's (its socket) and the
// database's (its tcp_keepalives_* settings, given at connect).
var pgKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}

var pgDialer = &net.Dialer{KeepAliveConfig: pgKeepAlive}

// pgDial connects a session with keepalives, on a quiet socket
// (quietconn_linux.go): a broker at a steady rate waits on the database
// for most of its requests, and each wait ended with a read the runtime
// heard of.
func pgDial(ctx context.Context, network, addr string) (net.Conn, error) {
	nc, err := pgDialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return quietSocket(nc), nil
}
