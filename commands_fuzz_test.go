package main

// FuzzCommands sends the command table's commands, with fields the fuzzer
// chooses, to a server in memory mode, a few commands an input on one
// connection that keeps its state (the jobs it pulled, its workers, its
// subscription), so that a command meets the jobs, tokens and queues the
// ones before it made: strings in the fields may be ids and tokens
// earlier answers gave. Whatever the fields, every command must answer a
// map with a boolean ok and the request's reqId, with a reason when ok is
// false, and never the "Internal server error" of a handler that panicked
// (safeCall), nor a database's error (its SQLSTATE) in PostgreSQL mode.
//
//	go test -run '^$' -fuzz FuzzCommands -fuzztime 5m
//	FUZZLOG=1 go test -run FuzzCommands -v   # the seeds' requests and answers
//
// Crashers found are kept under testdata/fuzz/FuzzCommands. The commands
// that reach out of the process (webhooks, handlers, which call URLs) are
// left out.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fuzzFieldNames are the request fields the reference's command types
// name (domain/types/commands), and a few that no command reads.
var fuzzFieldNames = []string{
	"activeJobs", "asc", "backoff", "capabilities", "childId", "childrenIds", "concurrency", "config",
	"continueParentOnFailure", "count", "customId", "data", "debounceId", "debounceTtl", "dedup",
	"deduplicationId", "delay", "dependsOn", "detach", "durable", "duration", "durations", "enabled", "end",
	"endDate", "error", "events", "every", "extend", "failParentOnFailure", "failed", "filter", "grace",
	"group", "groupId", "groupMaxSize", "hostname", "id", "ids", "ignoreDependencyOnFailure", "immediately",
	"includeJobs", "jobId", "jobName", "jobOptions", "jobs", "jobsLimit", "keepLogs", "level", "lifo",
	"limit", "lockTtl", "max", "maxAttempts", "maxCount", "maxJobs", "maxLength", "maxLimit", "message",
	"name", "offset", "owner", "parentId", "pattern", "pid", "prevMillis", "preventOverlap", "priority",
	"processed", "progress", "protocolVersion", "queue", "queues", "removeDependencyOnFailure",
	"removeOnComplete", "removeOnCompletes", "removeOnFail", "repeat", "repeatEvery", "replace", "result",
	"results", "schedule", "secret", "sizeLimit", "skipIfNoWorker", "skipMissedOnRestart", "stack",
	"stackTraceLimit", "stallTimeout", "start", "startDate", "startedAt", "state", "tags", "timeout",
	"timestamp", "timezone", "token", "tokens", "ttl", "type", "tz", "uniqueKey", "unrecoverable", "url",
	"webhookId", "workerId", "children", "opts", "parent", "x",
}

// fuzzCommandNames are the commands the fuzzer sends: the whole table but
// those that call URLs, sorted (an input's bytes pick them by index). Made
// once: the table is filled by an init function, after package variables.
var fuzzCommandNames = sync.OnceValue(func() []string {
	var out []string
	for name := range commands {
		switch name {
		case "AddWebhook", "SetWebhookEnabled", "RemoveWebhook", "HandlerSet", "HandlerRemove":
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
})

// fuzzProgram reads the fuzzer's bytes as requests; past the end every
// read is zero, so any input is a program.
type fuzzProgram struct {
	b    []byte
	seen []string // ids and tokens earlier answers gave
}

func (p *fuzzProgram) byte() byte {
	if len(p.b) == 0 {
		return 0
	}
	c := p.b[0]
	p.b = p.b[1:]
	return c
}

func (p *fuzzProgram) done() bool { return len(p.b) == 0 }

// fuzzStrings are strings worth trying besides the ids seen.
var fuzzStrings = []string{
	"", "q", "q2", "a:b", "*", "waiting", "active", "completed", "failed", "delayed", "prioritized",
	"waiting-children", "paused", "0", "-1", "1e400", "00000000-0000-0000-0000-000000000000",
	"* * * * *", "*/0 * * * *", "0 0 31 2 *", "@every 1s", "Europe/Rome", "Not/AZone", "info", "warn",
	"\x00", "\xff\xfe", strings.Repeat("x", 300), "ÿ", "__proto__", "job:completed",
}

// value writes one value, depth levels of arrays and maps at most.
func (p *fuzzProgram) value(e *Enc, depth int) {
	kind := p.byte() % 16
	if depth <= 0 && kind >= 13 {
		kind %= 13
	}
	switch kind {
	case 0:
		e.Nil()
	case 1:
		e.Bool(p.byte()&1 == 1)
	case 2:
		e.Int(int64(p.byte()))
	case 3:
		e.Int(-int64(p.byte()) - 1)
	case 4:
		v := int64(p.byte())<<24 | int64(p.byte())<<16 | int64(p.byte())<<8 | int64(p.byte())
		e.Int(v * 1000)
	case 5:
		e.Uint64Exact(math.MaxUint64 - uint64(p.byte()))
	case 6:
		e.Int64Exact(math.MinInt64 + int64(p.byte()))
	case 7:
		fs := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0.5, 1e300, -1e-300, 2.5e9, 9007199254740993}
		e.Float64(fs[int(p.byte())%len(fs)])
	case 8:
		e.Float32(float32(p.byte()) / 3)
	case 9:
		if len(p.seen) > 0 {
			e.Str(p.seen[int(p.byte())%len(p.seen)])
		} else {
			e.Str("")
		}
	case 10:
		e.Str(fuzzStrings[int(p.byte())%len(fuzzStrings)])
	case 11:
		n := int(p.byte() % 24)
		s := make([]byte, 0, n)
		for range n {
			s = append(s, p.byte())
		}
		e.Str(string(s))
	case 12:
		e.Bin([]byte{p.byte(), p.byte()})
	case 13, 14:
		n := int(p.byte() % 5)
		e.ArrayHead(n)
		for range n {
			p.value(e, depth-1)
		}
	default:
		n := int(p.byte() % 4)
		e.MapHead(n)
		for range n {
			p.fieldName(e)
			p.value(e, depth-1)
		}
	}
}

func (p *fuzzProgram) fieldName(e *Enc) {
	e.Str(fuzzFieldNames[int(p.byte())%len(fuzzFieldNames)])
}

// learn keeps the ids and tokens an answer gives, for later requests.
func (p *fuzzProgram) learn(v any) {
	switch x := v.(type) {
	case map[string]any:
		// In the keys' order: an input must run the same way every time.
		for _, k := range slices.Sorted(maps.Keys(x)) {
			val := x[k]
			if s, ok := val.(string); ok && (k == "id" || k == "jobId" || k == "token" || k == "workerId" || k == "name") {
				if len(p.seen) < 32 {
					p.seen = append(p.seen, s)
				}
			}
			p.learn(val)
		}
	case []any:
		for _, val := range x {
			p.learn(val)
		}
	}
}

// checkFuzzAnswer checks one answer frame (its 4-byte length first) to the
// request reqID.
func checkFuzzAnswer(t *testing.T, p *fuzzProgram, cmd, reqID string, frame []byte) {
	t.Helper()
	if len(frame) < 4 {
		t.Fatalf("%s: a frame of %d bytes", cmd, len(frame))
	}
	v, err := Decode(frame[4:])
	if err != nil {
		t.Fatalf("%s: undecodable answer: %v", cmd, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: the answer is not a map: %#v", cmd, v)
	}
	okv, isBool := m["ok"].(bool)
	if !isBool {
		t.Fatalf("%s: the answer has no boolean ok: %#v", cmd, m)
	}
	if got, _ := m["reqId"].(string); got != reqID {
		t.Fatalf("%s: the answer's reqId is %#v, want %q", cmd, m["reqId"], reqID)
	}
	if !okv {
		msg, _ := m["error"].(string)
		if msg == "" {
			t.Fatalf("%s: refused without a reason: %#v", cmd, m)
		}
		if strings.Contains(msg, "Internal server error") {
			t.Fatalf("%s: the handler failed: %s", cmd, msg)
		}
		if strings.Contains(msg, "SQLSTATE") {
			// A request the server should have refused itself, or a
			// database error it should have named in its own words.
			t.Fatalf("%s: refused by the database: %s", cmd, msg)
		}
	}
	if os.Getenv("FUZZLOG") != "" {
		t.Logf("%s %s -> %v", cmd, reqID, m)
	}
	p.learn(m)
}

func FuzzCommands(f *testing.F) {
	addCommandSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		b := NewMemEngine(1, nil)
		defer b.Close()
		runFuzzCommands(t, memServer(b, nil, quietLog()), in)
	})
}

// FuzzCommandsSQLite is FuzzCommands in SQLite mode, where every change
// is also recorded for the writer and read back at the end:
//
//	go test -run '^$' -fuzz FuzzCommandsSQLite -fuzztime 5m
func FuzzCommandsSQLite(f *testing.F) {
	addCommandSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		path := filepath.Join(t.TempDir(), "q.db")
		b, st, _ := openTestStore(t, path)
		runFuzzCommands(t, memServer(b, nil, quietLog()), in)
		b.Close()
		if err := st.Close(); err != nil {
			t.Fatalf("closing the store: %v", err)
		}
		// What the commands wrote reads back.
		b2, st2, _ := openTestStore(t, path)
		b2.Close()
		st2.Close()
	})
}

// FuzzCommandsPG is FuzzCommands in PostgreSQL mode, whose engine reads
// and writes every job through SQL. One broker and namespace serve the
// whole run (making a namespace takes longer than an input), so an input
// meets what the inputs before it left: a failure may need them too.
// The fuzzing workers are stopped without their cleanup, so a fuzzing
// run leaves their namespaces' schemas (queued_fz...) to drop after it.
//
//	go test -run '^$' -fuzz FuzzCommandsPG -fuzztime 5m
func FuzzCommandsPG(f *testing.F) {
	url := needPG(f)
	addCommandSeeds(f)
	var r [4]byte
	rand.Read(r[:])
	ns := "fz" + hex.EncodeToString(r[:])
	b := NewBroker()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pg, err := openPG(ctx, url, ns, b, quietLog(), pgOptions{})
	if err != nil {
		b.Close()
		f.Fatal(err)
	}
	srv := NewServer(b, pg, nil, quietLog())
	srv.usePG(pg)
	f.Cleanup(func() {
		pg.Close()
		b.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pgAdminExec(ctx, "DROP SCHEMA IF EXISTS queued_"+ns+" CASCADE")
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		runFuzzCommands(t, srv, in)
	})
}

// addCommandSeeds adds the fuzzers' seeds.
func addCommandSeeds(f *testing.F) {
	names := fuzzCommandNames()
	idx := func(name string) byte {
		i := slices.Index(names, name)
		if i < 0 || i > 255 {
			f.Fatalf("no command %s among %d", name, len(names))
		}
		return byte(i)
	}
	field := func(name string) byte { return byte(slices.Index(fuzzFieldNames, name)) }
	// A push, a pull of it, its ACK with the token the pull gave (kind 9:
	// a string seen), and a few other common sequences.
	f.Add([]byte{
		idx("PUSH"), 2, field("queue"), 10, 1, field("data"), 15, 1, field("x"), 2, 7,
		idx("PULL"), 3, field("queue"), 10, 1, field("timeout"), 2, 0, field("owner"), 10, 2,
		idx("ACK"), 2, field("id"), 9, 0, field("token"), 9, 1,
	})
	f.Add([]byte{
		idx("PUSHB"), 2, field("queue"), 10, 1, field("jobs"), 13, 3, 15, 1, field("data"), 2, 1, 15, 1, field("priority"), 2, 9, 0,
		idx("PULLB"), 3, field("queue"), 10, 1, field("count"), 2, 5, field("owner"), 10, 2,
		idx("ACKB"), 2, field("ids"), 13, 2, 9, 0, 9, 2, field("tokens"), 13, 2, 9, 1, 9, 3,
		idx("FAIL"), 2, field("id"), 9, 0, field("error"), 10, 25,
	})
	f.Add([]byte{
		idx("PUSH"), 3, field("queue"), 10, 1, field("data"), 0, field("delay"), 4, 0, 0, 0, 9,
		idx("GetJob"), 1, field("id"), 9, 0,
		idx("ChangeDelay"), 2, field("id"), 9, 0, field("delay"), 3, 5,
		idx("Promote"), 1, field("id"), 9, 0,
		idx("GetJobs"), 4, field("queue"), 10, 1, field("state"), 10, 6, field("start"), 3, 0, field("end"), 5, 0,
	})
	f.Add([]byte{
		idx("Cron"), 4, field("name"), 10, 2, field("queue"), 10, 1, field("schedule"), 10, 17, field("timezone"), 10, 24,
		idx("CronList"), 0,
		idx("CronDelete"), 1, field("name"), 9, 0,
	})
	f.Add([]byte{
		idx("PUSHF"), 2, field("queue"), 10, 1, field("children"), 13, 2, 15, 2, field("queue"), 10, 2, field("data"), 7, 0, 15, 0,
		idx("GetChildrenValues"), 1, field("id"), 9, 0,
		idx("RateLimit"), 2, field("queue"), 10, 1, field("limit"), 3, 0,
		idx("SetConcurrency"), 2, field("queue"), 10, 1, field("limit"), 6, 0,
		idx("PULL"), 2, field("queue"), 10, 1, field("timeout"), 2, 50,
	})
	f.Add([]byte{idx("RegisterWorker"), 3, field("name"), 11, 4, 'w', 'o', 'r', 'k', field("queues"), 13, 1, 10, 1, field("concurrency"), 5, 0,
		idx("Heartbeat"), 1, field("id"), 9, 0, idx("ListWorkers"), 0, idx("UnregisterWorker"), 1, field("workerId"), 9, 0})
	f.Add([]byte{idx("SubscribeEvents"), 1, field("queue"), 10, 1, idx("PUSH"), 1, field("queue"), 10, 1, idx("Obliterate"), 1, field("queue"), 10, 1})

}

// runFuzzCommands runs the requests in reads from the fuzzer's bytes
// on srv, and checks every answer.
func runFuzzCommands(t *testing.T, srv *Server, in []byte) {
	names := fuzzCommandNames()
	// Commands that wait (a long poll, WaitJob) end with the
	// connection: a short life for all of them.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	var later [][]byte
	arrived := make(chan struct{}, 1)
	c := newVirtualConn(srv, ctx, "fuzz", func(frame []byte) {
		mu.Lock()
		later = append(later, append([]byte(nil), frame...))
		mu.Unlock()
		select {
		case arrived <- struct{}{}:
		default:
		}
	}, false)
	p := &fuzzProgram{b: in}
	sent := map[string]string{} // reqId -> command, of the answers not yet checked
	// check checks the answers given later that have come, and forgets
	// them; it reports whether reqID's was among them.
	check := func(reqID string) bool {
		mu.Lock()
		frames := later
		later = nil
		mu.Unlock()
		found := false
		for _, frame := range frames {
			v, err := Decode(frame[4:])
			if err != nil {
				t.Fatalf("undecodable answer given later: %v", err)
			}
			m, _ := v.(map[string]any)
			id, _ := m["reqId"].(string)
			cmd, ok := sent[id]
			if !ok {
				continue // an event of the subscription
			}
			delete(sent, id)
			checkFuzzAnswer(t, p, cmd, id, frame)
			found = found || id == reqID
		}
		return found
	}
	for n := 0; n < 8 && !p.done(); n++ {
		cmd := names[int(p.byte())%len(names)]
		reqID := fmt.Sprintf("f%d", n)
		var req Enc
		mp := req.OpenMap()
		req.Str("cmd")
		req.Str(cmd)
		k := 2
		for range int(p.byte() % 6) {
			p.fieldName(&req)
			p.value(&req, 3)
			k++
		}
		req.Str("reqId")
		req.Str(reqID)
		req.CloseMap(mp, k)
		m, err := parseRequest(req.B, nil, maxRequestFields)
		if err != nil {
			continue // refused before any command runs: the parsers' fuzzers cover it
		}
		var e Enc
		c.dispatch(m, &e)
		if len(e.B) > 0 {
			checkFuzzAnswer(t, p, cmd, reqID, e.B)
			continue
		}
		// Answered later (a long poll, or any command in PostgreSQL mode,
		// answered once its round commits): the next command gets the ids
		// it gave when it comes within a moment.
		sent[reqID] = cmd
		deadline := time.After(50 * time.Millisecond)
	waiting:
		for !check(reqID) {
			select {
			case <-arrived:
			case <-deadline:
				break waiting
			}
		}
	}
	c.finishVirtual()
	check("")
}
