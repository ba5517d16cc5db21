package main

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestPGClaimRounds: pulls of one queue that arrive together are claimed
// in shared rounds (claim); each still gets at most its count, jobs with
// a lease only when it named an owner (with a token that ACK accepts and
// that no other pull's token opens), every job exactly once, and a pull
// whose count the round could not fill waits for the next push.
func TestPGClaimRounds(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGBroker(t, ns)
	const pulls, jobs = 24, 150
	pusher := dial(t, b.addr())
	pushMany(t, []*tclient{pusher}, "rounds", jobs, 50)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, pulls)
	for i := range pulls {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := dial(t, b.addr())
			count := 1 + i%9
			m := M{"cmd": "PULLB", "queue": "rounds", "count": count, "timeout": 5000}
			owner := ""
			if i%2 == 0 {
				owner = fmt.Sprint("w", i)
				m["owner"], m["lockTtl"] = owner, 30000
			}
			a := c.ok(m)
			got := list(t, a, "jobs")
			if len(got) == 0 || len(got) > count {
				errs <- fmt.Errorf("pull %d asked for %d, got %d", i, count, len(got))
				return
			}
			var toks []any
			if owner != "" {
				toks = list(t, a, "tokens")
				if len(toks) != len(got) {
					errs <- fmt.Errorf("pull %d: %d tokens for %d jobs", i, len(toks), len(got))
					return
				}
			}
			for k, j := range got {
				id := j.(map[string]any)["id"].(string)
				mu.Lock()
				seen[id]++
				mu.Unlock()
				ack := M{"cmd": "ACK", "id": id}
				if owner != "" {
					// Another pull's token does not open the job; its own does.
					if msg := c.fail(M{"cmd": "ACK", "id": id, "token": "not-" + toks[k].(string)}); msg == "" {
						errs <- fmt.Errorf("pull %d: ACK with a wrong token accepted", i)
						return
					}
					ack["token"] = toks[k]
				}
				c.ok(ack)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("job %s handed out %d times", id, n)
		}
		total++
	}
	// 24 pulls of 1..9 jobs ask for 111 of the 150: every pull was served in full.
	if want := 111; total != want {
		t.Fatalf("%d jobs handed out, want %d", total, want)
	}
	// A pull left waiting by a round is served by the next push.
	c := dial(t, b.addr())
	c.ok(M{"cmd": "PULLB", "queue": "rounds", "count": 1000})
	id, ch := c.send(M{"cmd": "PULL", "queue": "rounds", "timeout": 10000})
	pollWaiting(t, c)
	pusher.ok(M{"cmd": "PUSH", "queue": "rounds", "data": M{"late": true}})
	if a := c.await(id, ch, 15*time.Second); a["job"] == nil {
		t.Fatalf("waiting pull after a push: %v", a)
	}
}

// TestPGAckRounds: ACK batches sent together are written in shared
// rounds (ack), with the outcome each would have had alone in arrival
// order: of two batches naming the same job, exactly one completes it
// and the other is told it was ignored; a wrong token is refused
// without failing the batch it shares a round with.
func TestPGAckRounds(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	b := startPGBroker(t, ns)
	const n, reqs = 200, 20
	c := dial(t, b.addr())
	pushMany(t, []*tclient{c}, "acks", n, 100)
	var ids []string
	for len(ids) < n {
		for _, j := range list(t, c.ok(M{"cmd": "PULLB", "queue": "acks", "count": 100}), "jobs") {
			ids = append(ids, j.(map[string]any)["id"].(string))
		}
	}
	// Request i acks ids [i*10, i*10+20): every job is in two requests.
	var wg sync.WaitGroup
	var mu sync.Mutex
	ignored := 0
	for i := range reqs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			w := dial(t, b.addr())
			var part []any
			for k := i * 10; k < i*10+20; k++ {
				part = append(part, ids[k%n])
			}
			a := w.ok(M{"cmd": "ACKB", "ids": part})
			d, _ := a["data"].(map[string]any)
			ign, _ := d["ignoredIds"].([]any)
			mu.Lock()
			ignored += len(ign)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	if ignored != n {
		t.Fatalf("%d ACKs ignored, want %d (each job acked twice)", ignored, n)
	}
	counts := sub(t, c.ok(M{"cmd": "GetJobCounts", "queue": "acks"}), "counts")
	if got := num(t, counts["completed"]); got != n {
		t.Fatalf("%v jobs completed, want %d: %v", got, n, counts)
	}
	// A wrong token in a round with good ACKs: refused alone.
	pushMany(t, []*tclient{c}, "acks", 2, 2)
	a := c.ok(M{"cmd": "PULLB", "queue": "acks", "count": 2, "owner": "w", "lockTtl": 30000})
	js, toks := list(t, a, "jobs"), list(t, a, "tokens")
	id0, id1 := js[0].(map[string]any)["id"], js[1].(map[string]any)["id"]
	bad, badCh := c.send(M{"cmd": "ACK", "id": id0, "token": "wrong"})
	good, goodCh := c.send(M{"cmd": "ACK", "id": id1, "token": toks[1]})
	if r := c.await(bad, badCh, 10*time.Second); r["ok"] == true {
		t.Fatalf("ACK with a wrong token: %v", r)
	}
	if r := c.await(good, goodCh, 10*time.Second); r["ok"] != true {
		t.Fatalf("ACK beside a refused one: %v", r)
	}
	c.ok(M{"cmd": "ACK", "id": id0, "token": toks[0]})
}
