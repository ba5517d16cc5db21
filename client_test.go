package main

// The protocol client: pipelining with answers matched by reqId (even out
// of order), timeouts that leave the connection usable, Auth on connect,
// events, and failures that end calls instead of hanging them.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestClientPipelinesAndMatchesAnswers(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c, err := dialClient(t, ClientConfig{Addr: ts.addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	// Many goroutines at once on one connection: each gets its own answer.
	const n = 300
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := c.Call(ctx, map[string]any{"cmd": "PUSH", "queue": "cq", "data": map[string]any{"i": i}})
			if err != nil {
				errs <- err
				return
			}
			ids[i], _ = a["id"].(string)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range n {
		a, err := c.Call(ctx, map[string]any{"cmd": "GetJob", "id": ids[i]})
		if err != nil {
			t.Fatal(err)
		}
		if got := a["job"].(map[string]any)["data"].(map[string]any)["i"]; got != int64(i) {
			t.Fatalf("job %d holds data %v: answers were mismatched", i, got)
		}
	}

	// A long poll does not hold up what is sent after it on the same
	// connection: the server answers out of order, the client sorts it.
	pulled := make(chan error, 1)
	go func() {
		// Its timeout far above the Ping's bound: a Ping held behind it
		// would take that long, whatever the machine is doing.
		a, err := c.Call(ctx, map[string]any{"cmd": "PULL", "queue": "later", "timeout": 30000})
		if err == nil && a["job"] == nil {
			err = errors.New("PULL answered without the job")
		}
		pulled <- err
	}()
	// The poll is in and waiting before the Ping is sent behind it.
	awaitPullsWaiting(t, ts.addr, 1)
	start := time.Now()
	if _, err := c.Call(ctx, map[string]any{"cmd": "Ping"}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Ping behind a long poll took %v", d)
	}
	if _, err := c.Call(ctx, map[string]any{"cmd": "PUSH", "queue": "later", "data": 1}); err != nil {
		t.Fatal(err)
	}
	if err := <-pulled; err != nil {
		t.Fatal(err)
	}
}

func TestClientServerErrorsAndTimeouts(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c, err := dialClient(t, ClientConfig{Addr: ts.addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	a, err := c.Call(ctx, map[string]any{"cmd": "Frobnicate"})
	var se *ServerError
	if !errors.As(err, &se) || se.Msg != "Unknown command: Frobnicate" || se.Cmd != "Frobnicate" || a["ok"] != false {
		t.Fatalf("unknown command: %v %v", a, err)
	}
	if _, err := c.Call(ctx, map[string]any{"queue": "x"}); err == nil {
		t.Error("a request without cmd was sent")
	}
	body, err := c.Send(ctx, "GetJob", func(e *Enc) int { e.Str("id"); e.Str("none"); return 1 })
	if err != nil {
		t.Fatal(err)
	}
	if err := AnswerError("GetJob", body); err == nil || err.Error() != "Job not found" {
		t.Errorf("AnswerError: %v", err)
	}

	// A call that gives up returns at its deadline; the late answer is
	// dropped and the connection goes on.
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	start := time.Now()
	_, err = c.Call(short, map[string]any{"cmd": "PULL", "queue": "nothing", "timeout": 2000})
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("call past its deadline: %v after %v", err, time.Since(start))
	}
	// The server holds the poll past the call's deadline, then answers
	// it, for nobody. A second poll as long, sent after it on the same
	// connection, is answered after it (its time runs out later): when
	// the second's own empty answer arrives, the late one has come and
	// gone. (Counting the process's parked polls, as this did, is thrown
	// off by other tests' polls.)
	a, err = c.Call(ctx, map[string]any{"cmd": "PULL", "queue": "nothing", "timeout": 2000})
	if err != nil || a["job"] != nil {
		t.Fatalf("the second poll: %v %v", a, err)
	}
	if _, err := c.Call(ctx, map[string]any{"cmd": "Ping"}); err != nil {
		t.Fatalf("after a timed-out call: %v", err)
	}
	if c.Err() != nil {
		t.Fatalf("connection broken: %v", c.Err())
	}
}

func TestClientConnectionLossEndsCalls(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	c, err := dialClient(t, ClientConfig{Addr: ts.addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, map[string]any{"cmd": "PULL", "queue": "q", "timeout": 30000})
		waiting <- err
	}()
	// The call is waiting on the server, not still being sent, when it
	// goes away.
	awaitPullsWaiting(t, ts.addr, 1)
	if !ts.stop(15 * time.Second) {
		t.Fatal("server did not stop")
	}
	// The server ends long polls with empty answers on shutdown; either
	// that answer or the lost connection ends the call, promptly.
	select {
	case <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("a call was left hanging after the server went away")
	}
	eventually(t, 5*time.Second, "the client notices the closed connection", func() (bool, string) {
		return c.Err() != nil, "no error yet"
	})
	if _, err := c.Call(ctx, map[string]any{"cmd": "Ping"}); err == nil {
		t.Error("a call on a dead connection succeeded")
	}
	// Close after the loss, and twice, is fine.
	c.Close()
	c.Close()

	// Dialing nobody fails with the address.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	if _, err := dialClient(t, ClientConfig{Addr: addr}); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("dial to a closed port: %v", err)
	}
}

func TestClientAuthOnConnect(t *testing.T) {
	t.Parallel()
	ts := startServer(t, &config{authTokens: "a,b"})
	if c, err := dialClient(t, ClientConfig{Addr: ts.addr, Token: "b"}); err != nil {
		t.Fatal(err)
	} else if err := ping(t, c); err != nil {
		t.Fatal(err)
	}
	if _, err := dialClient(t, ClientConfig{Addr: ts.addr, Token: "z"}); err == nil ||
		!strings.Contains(err.Error(), "authentication failed: Invalid token") {
		t.Errorf("wrong token: %v", err)
	}
	c, err := dialClient(t, ClientConfig{Addr: ts.addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(t, c); err == nil || !strings.Contains(err.Error(), "Not authenticated") {
		t.Errorf("no token: %v", err)
	}
}

func TestClientEvents(t *testing.T) {
	t.Parallel()
	ts := startServer(t, nil)
	events := make(chan string, 16)
	c, err := dialClient(t, ClientConfig{Addr: ts.addr, OnEvent: func(body []byte) {
		v, _ := Decode(body)
		m, _ := v.(map[string]any)
		if ev, ok := m["event"].(map[string]any); ok {
			events <- fmt.Sprint(ev["eventType"])
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if _, err := c.Call(ctx, map[string]any{"cmd": "SubscribeEvents", "queue": "ev"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, map[string]any{"cmd": "PUSH", "queue": "ev", "data": 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev == "" {
			t.Error("event without a type")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event delivered")
	}
}
