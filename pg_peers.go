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
// brokers that listen. A broker counts them at its start and every few
// seconds and is alone when its own listener's session is the only one.
// Forwarding is the safe side of every doubt: a broker whose listener is
// down (or whose session the database no longer shows holding the lock),
// or whose count failed, forwards.
//
// A broker that starts must not miss what the others do once it serves.
// It takes the lock, says hello on the event channel and waits, before it
// serves, for a reply from each holder its count found (by the listener
// session's pid, up to pgHelloWait); a broker that hears a hello forwards
// from then on and replies to that broker. A broker of an older version
// holds no lock: hearing anything from another broker turns forwarding on
// for pgPeerQuiet after the last of it.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgPeerCheck is how often a broker counts the brokers listening.
	pgPeerCheck = 2 * time.Second
	// pgPeerQuiet is how long a broker forwards after it last heard
	// another broker, whatever the count says (that broker may be of a
	// version that holds no lock).
	pgPeerQuiet = time.Minute
	// pgHelloWait bounds how long a starting broker waits for the others
	// to reply to its hello before it serves.
	pgHelloWait = 2 * time.Second
	// pgPeerClass is the first key of the listeners' advisory lock (the
	// two-key form, apart from the single-key locks of migrations, DLQ
	// trims and dedup); the second is the namespace's (peerKey).
	pgPeerClass int32 = 0x71756564 // "qued"
	// The hello and its reply, as the body of an event notification:
	// an empty MessagePack array, once as fixarray and once as array16,
	// so that a broker of an older version decodes an empty batch and
	// delivers nothing. A reply's sender is "replier@hello-sender@pid",
	// pid the replier's listener session (broker ids have no '@').
	pgHello = "kA=="
	pgReply = "3AAA"
	// pgPeersSQL finds the listeners of the namespace, the holders of its
	// advisory lock: the sessions other than $3, and whether $3 is one.
	pgPeersSQL = `SELECT coalesce(array_agg(pid) FILTER (WHERE pid <> $3), '{}'), coalesce(bool_or(pid = $3), false)
		FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2`
)

// pgPeers is what a broker knows of the other brokers listening.
type pgPeers struct {
	key   int32       // the namespace's advisory lock key (peerKey)
	alone atomic.Bool // no other broker listens: forward nothing

	mu        sync.Mutex
	pid       int32          // the listener's session while it holds the lock, as this broker believes; 0: none
	gen       int64          // counts what may change the answer: anything heard from another broker, the lock taken or lost
	lastAt    time.Time      // when another broker was last heard
	quiet     time.Duration  // pgPeerQuiet
	helloWait time.Duration  // pgHelloWait
	waiting   map[int32]bool // before serving: the holders whose reply the hello waits for
	answered  int            // replies the first hello had from them
	timer     *time.Timer    // serves after helloWait whatever the replies
}

// peerKey is the advisory lock key of a namespace's listeners.
func peerKey(schema string) int32 {
	return int32(fnv1a("queued-brokers:"+schema) & 0x7fffffff)
}

// forwarding says whether events, notices and wake-ups go to other
// brokers.
func (p *PG) forwarding() bool { return !p.peers.alone.Load() }

// serving reports whether the broker serves already (listening closed).
func (p *PG) serving() bool { return isClosed(p.listening) }

// serve lets OpenPG return: the hello had its replies, or waited enough.
// listening is closed under p.peers.mu, so that holdPresence, which asks
// under it, sees the wait either under way or over.
func (p *PG) serve() {
	p.peers.mu.Lock()
	defer p.peers.mu.Unlock()
	p.endHelloWait()
	p.listened.Do(func() { close(p.listening) })
}

// endHelloWait ends the first hello's wait: it is over, or the broker is
// closing. p.peers.mu is held.
func (p *PG) endHelloWait() {
	p.peers.waiting = nil
	if p.peers.timer != nil {
		p.peers.timer.Stop()
		p.peers.timer = nil
	}
}

// countPeers finds the other sessions holding the listeners' lock, and
// whether pid (this broker's listener) holds it.
func (p *PG) countPeers(ctx context.Context, q pgQuerier, pid int32) (others []int32, mine bool, err error) {
	err = q.QueryRow(ctx, pgPeersSQL, pgPeerClass, p.peers.key, pid).Scan(&others, &mine)
	return others, mine, err
}

// holdPresence takes the namespace's listener lock on the listener's
// connection (held until it closes), counts the other holders and says
// hello. Before the broker serves, it waits for their replies (serve).
func (p *PG) holdPresence(ctx context.Context, c *pgx.Conn) error {
	ps := &p.peers
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock_shared($1, $2)`, pgPeerClass, ps.key); err != nil {
		return fmt.Errorf("take the brokers' presence lock: %w", err)
	}
	var pid int32
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return fmt.Errorf("read the listener's session: %w", err)
	}
	others, _, err := p.countPeers(ctx, c, pid)
	if err != nil {
		return fmt.Errorf("count the brokers listening: %w", err)
	}
	ps.mu.Lock()
	// Under ps.mu, as serve clears the wait under it: a hello timed out
	// meanwhile leaves nothing to wait for.
	first := !p.serving()
	ps.pid = pid
	ps.gen++
	// As peerRound decides, at once: a broker alone from its start sends
	// nothing for its first moments either.
	ps.decide(others, true)
	if first {
		ps.waiting = make(map[int32]bool, len(others))
		for _, o := range others {
			ps.waiting[o] = true
		}
		ps.answered = 0
	}
	ps.mu.Unlock()
	if _, err := c.Exec(ctx, `SELECT pg_notify($1, $2)`, p.evName, p.broker+" "+pgHello); err != nil {
		return fmt.Errorf("say hello to the other brokers: %w", err)
	}
	if !first {
		return nil
	}
	if len(others) == 0 {
		p.serve()
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.waiting == nil {
		return nil // served meanwhile
	}
	if ps.timer != nil {
		ps.timer.Stop() // a hello before a reconnect
	}
	ps.timer = time.AfterFunc(ps.helloWait, func() {
		if p.closing() {
			return
		}
		ps.mu.Lock()
		late := len(ps.waiting)
		ps.mu.Unlock()
		if late > 0 {
			p.log.Warn("serving before every other broker replied; events they make at once may not reach this broker's subscribers",
				"brokers", len(others), "silent", late)
		}
		p.serve()
	})
	return nil
}

// lostPresence records that the listener's connection (and with it the
// lock) is gone: until it is back, this broker cannot tell who listens.
func (p *PG) lostPresence() {
	p.peers.mu.Lock()
	p.peers.pid = 0
	p.peers.gen++
	p.peers.mu.Unlock()
	p.peers.alone.Store(false)
}

// heardPeer handles a notification on the event channel from another
// broker (from its sender field, body the rest), before its events are
// delivered; true when it was a hello or a reply, which carry none.
func (p *PG) heardPeer(from, body string) bool {
	ps := &p.peers
	ps.mu.Lock()
	ps.gen++
	ps.lastAt = time.Now()
	ps.alone.Store(false)
	done := false
	if body == pgReply {
		// replier@hello-sender@pid: only a reply to this broker's hello,
		// from a holder it waits for, counts.
		parts := strings.Split(from, "@")
		if len(parts) == 3 && parts[1] == p.broker && ps.waiting != nil {
			if pid, err := strconv.ParseInt(parts[2], 10, 32); err == nil && ps.waiting[int32(pid)] {
				delete(ps.waiting, int32(pid))
				ps.answered++
				done = len(ps.waiting) == 0
			}
		}
	}
	ps.mu.Unlock()
	switch body {
	case pgHello:
		// Forwarding is on before the reply goes: once the new broker has
		// it, what this one does reaches it. One reply a broker, however
		// many hellos it sent meanwhile: what waits is bounded by the
		// brokers, not by the notifications.
		p.ev.mu.Lock()
		if !slices.Contains(p.ev.replies, from) {
			p.ev.replies = append(p.ev.replies, from)
		}
		p.ev.mu.Unlock()
		p.kickForwarder()
		return true
	case pgReply:
		if done {
			p.serve()
		}
		return true
	}
	return false
}

// replyPayload is this broker's reply to the hello of broker to.
func (p *PG) replyPayload(to string) string {
	p.peers.mu.Lock()
	pid := p.peers.pid
	p.peers.mu.Unlock()
	return p.broker + "@" + to + "@" + strconv.Itoa(int(pid)) + " " + pgReply
}

// peerRound counts the brokers listening and decides whether this one is
// alone. Anything heard from another broker while it counted, or the
// lock taken or lost meanwhile, leaves the decision to the next round.
func (p *PG) peerRound(ctx context.Context) {
	ps := &p.peers
	ps.mu.Lock()
	gen, pid := ps.gen, ps.pid
	ps.mu.Unlock()
	if pid == 0 {
		return
	}
	others, mine, err := p.countPeers(ctx, p.pool, pid)
	if err != nil {
		p.log.Debug("counting the brokers listening", "err", err)
		ps.alone.Store(false)
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.gen != gen {
		return
	}
	ps.decide(others, mine)
}

// decide sets alone from a count of the lock's holders: others, and
// whether this broker's listener is among them (not, as far as the
// database knows, when its session was cut off and that is not noticed
// yet: the count then says nothing of who listens). ps.mu is held.
func (ps *pgPeers) decide(others []int32, mine bool) {
	ps.alone.Store(mine && len(others) == 0 && time.Since(ps.lastAt) > ps.quiet)
}
