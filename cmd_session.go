package main

// Handlers of the session: Auth, Hello, Ping, and a connection's own
// event subscription. They touch only this connection and broker, the
// same in every storage mode.

import "errors"

func cmdAuth(r *Req) error {
	tok, _, _ := r.m.Str("token")
	if r.c.srv.authRequired() && r.c.srv.checkToken(tok) {
		r.c.authed = true
		return r.okID()
	}
	return r.c.authFailed()
}

func cmdHello(r *Req) error {
	r.field("protocolVersion").Int(protocolVersion)
	e := r.field("capabilities")
	e.ArrayHead(2)
	e.Str("pipelining")
	e.Str("separate-job-name")
	r.field("server").Str(serverName)
	r.field("version").Str(compatVersion)
	return nil
}

func cmdPing(r *Req) error {
	e := r.field("data")
	e.MapHead(2)
	e.Str("pong")
	e.Bool(true)
	e.Str("time")
	e.Int(r.b.now())
	return nil
}

func cmdSubscribe(r *Req) error {
	if r.c.nc == nil {
		// A connection without a socket (a WebSocket's commands, an HTTP
		// request's) has nothing for the events to be written to: its
		// event writer would write to no socket and take the process down.
		// A WebSocket subscribes with Subscribe (live.go).
		return errors.New("SubscribeEvents needs a TCP connection (over a WebSocket, send Subscribe)")
	}
	q, err := queueArg(r.m)
	if err != nil {
		return err
	}
	r.b.subscribe(r.c, q)
	return r.okID()
}

func cmdUnsubscribe(r *Req) error {
	r.b.unsubscribe(r.c)
	return r.okID()
}
