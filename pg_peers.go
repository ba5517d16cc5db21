package main

// Whether any other broker listens on the namespace. A broker forwards its
// events and wake-ups (pg_events.go) for the others only: with no other,
// each NOTIFY was a statement, a commit that takes PostgreSQL's notify
// lock, and a payload sent back to this broker's own listener to be
// thrown away. In a drain through one broker that was a quarter of the
// broker's CPU and an eighth of the database's.
//
// Each broker's listener connection holds a shared advisory lock of the
// namespace for as long as it is connected, so the holders are the
// brokers that listen. A broker counts them every few seconds and is
// alone when it is the only one. Forwarding is the safe side of every
// doubt: a broker that has not counted yet, whose own listener is down,
// or whose count failed, forwards.
//
// A broker that starts must not miss what the others do once it serves.
// It takes the lock, says hello on the event channel and waits, before it
// serves, for a reply from each other holder (up to pgHelloWait); a
// broker that hears a hello forwards from then on and replies. A broker
// of an older version holds no lock: hearing any event from another
// broker also turns forwarding on, for pgPeerQuiet after the last one.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgPeerCheck is how often a broker counts the brokers listening.
	pgPeerCheck = 2 * time.Second
	// pgPeerQuiet is how long a broker forwards after it last heard an
	// event from another broker, whatever the count says (that broker
	// may be of a version that holds no lock).
	pgPeerQuiet = time.Minute
	// pgHelloWait bounds how long a starting broker waits for the others
	// to reply to its hello before it serves.
	pgHelloWait = 2 * time.Second
	// The hello and its reply, as the body of an event notification:
	// an empty MessagePack array, once as fixarray and once as array16,
	// so that a broker of an older version decodes an empty batch and
	// delivers nothing.
	pgHello = "kA=="
	pgReply = "3AAA"
	// pgPeersSQL counts the listeners of the namespace: the holders of
	// its advisory lock (pg_advisory_lock_shared of one bigint key under
	// 2^31 is classid 0, objid key, objsubid 1).
	pgPeersSQL = `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid = 0 AND objid = $1::bigint::oid AND objsubid = 1`
)

// pgPeers is what a broker knows of the other brokers listening.
type pgPeers struct {
	key   int64       // the namespace's advisory lock key
	alone atomic.Bool // no other broker listens: forward nothing

	mu        sync.Mutex
	held      bool                // this broker's listener holds the lock
	heard     int64               // count of events heard from other brokers
	lastAt    time.Time           // when the last of them was heard
	quiet     time.Duration       // pgPeerQuiet
	helloWait time.Duration       // pgHelloWait
	waitFor   int                 // replies the first hello waits for
	replied   map[string]struct{} // brokers that replied to it
	ready     func()              // called once the replies are in
}

// peerKey is the advisory lock key of a namespace's listeners.
func peerKey(schema string) int64 {
	return int64(fnv1a("queued-brokers:"+schema) & 0x7fffffff)
}

// forwarding says whether events and wake-ups go to other brokers.
func (p *PG) forwarding() bool { return !p.peers.alone.Load() }

// holdPresence takes the namespace's listener lock on the listener's
// connection (held until it closes), counts the holders, and says hello.
// ready is called once every other holder replied, or after pgHelloWait.
func (p *PG) holdPresence(ctx context.Context, c *pgx.Conn, ready func()) error {
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, p.peers.key); err != nil {
		return err
	}
	var n int
	if err := c.QueryRow(ctx, pgPeersSQL, p.peers.key).Scan(&n); err != nil {
		return err
	}
	ps := &p.peers
	ps.mu.Lock()
	ps.held = true
	ps.waitFor = n - 1
	ps.replied = map[string]struct{}{}
	once := sync.OnceFunc(ready)
	ps.ready = once
	// As peerRound decides, at once: a broker alone from its start sends
	// nothing for its first moments either.
	ps.alone.Store(n == 1 && time.Since(ps.lastAt) > ps.quiet)
	ps.mu.Unlock()
	if _, err := c.Exec(ctx, `SELECT pg_notify($1, $2)`, p.evName, p.broker+" "+pgHello); err != nil {
		return err
	}
	if n <= 1 {
		once()
	} else {
		time.AfterFunc(ps.helloWait, func() {
			select {
			case <-p.stop:
				return
			default:
			}
			ps.mu.Lock()
			late := len(ps.replied) < ps.waitFor
			ps.mu.Unlock()
			if late {
				p.log.Warn("serving before every other broker replied; events they make at once may not reach this broker's subscribers",
					"brokers", n-1)
			}
			once()
		})
	}
	return nil
}

// lostPresence records that the listener's connection (and with it the
// lock) is gone: until it is back, this broker cannot tell who listens.
func (p *PG) lostPresence() {
	p.peers.mu.Lock()
	p.peers.held = false
	p.peers.mu.Unlock()
	p.peers.alone.Store(false)
}

// heardPeer handles a notification on the event channel from another
// broker (from is its id, body the payload's rest), before its events
// are delivered; true when it was a hello or a reply, which carry none.
func (p *PG) heardPeer(from, body string) bool {
	ps := &p.peers
	ps.mu.Lock()
	ps.heard++
	ps.lastAt = time.Now()
	ps.alone.Store(false)
	var done func()
	if body == pgReply && ps.replied != nil {
		ps.replied[from] = struct{}{}
		if len(ps.replied) >= ps.waitFor {
			done = ps.ready
		}
	}
	ps.mu.Unlock()
	switch body {
	case pgHello:
		// Forwarding is on before the reply goes: once the new broker has
		// it, what this one does reaches it.
		p.ev.mu.Lock()
		p.ev.reply = true
		p.ev.mu.Unlock()
		p.kickForwarder()
		return true
	case pgReply:
		if done != nil {
			done()
		}
		return true
	}
	return false
}

// peerRound counts the brokers listening and decides whether this one is
// alone. An event heard from another broker while it counted keeps it
// forwarding.
func (p *PG) peerRound(ctx context.Context) {
	ps := &p.peers
	ps.mu.Lock()
	heard, held := ps.heard, ps.held
	ps.mu.Unlock()
	if !held {
		return
	}
	var n int
	if err := p.pool.QueryRow(ctx, pgPeersSQL, ps.key).Scan(&n); err != nil {
		p.log.Debug("counting the brokers listening", "err", err)
		ps.alone.Store(false)
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.heard != heard || !ps.held {
		return
	}
	ps.alone.Store(n == 1 && time.Since(ps.lastAt) > ps.quiet)
}
