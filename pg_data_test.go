package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPGBigDataKeptApart: a big job's data is kept in its row's data
// column, beside a record without it, and comes back whole through every
// kind of write: a FAIL and its retry, an Update to other big data and to
// small data, a flow's parent given its children's ids, and a row of the
// old form (the data in the record) written again.
func TestPGBigDataKeptApart(t *testing.T) {
	t.Parallel()
	ns := pgTestNamespace(t)
	c := dial(t, startPGBroker(t, ns).addr())
	ctx, conn := pgTestConn(t)
	jobs := "queued_" + ns + ".jobs"
	big := func(tag string) string { return tag + strings.Repeat("x", 3*pgDataApart) }
	// row says how the job's row holds its data: apart (in the column) or
	// in the record, and the record's size.
	row := func(id string) (apart bool, bodyLen int) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT data IS NOT NULL, octet_length(body) FROM `+jobs+` WHERE id = $1`, id).Scan(&apart, &bodyLen); err != nil {
			t.Fatal(err)
		}
		return apart, bodyLen
	}
	dataOf := func(id string) any {
		t.Helper()
		return sub(t, c.ok(M{"cmd": "GetJob", "id": id}), "job")["data"]
	}
	pullFail := func(q, id string) {
		t.Helper()
		a := c.ok(M{"cmd": "PULL", "queue": q, "owner": "w"})
		if job := sub(t, a, "job"); job["id"] != id {
			t.Fatalf("pulled %v, want %s", job["id"], id)
		}
		c.ok(M{"cmd": "FAIL", "id": id, "token": a["token"], "error": "again"})
	}

	c.ok(M{"cmd": "PUSH", "queue": "apart", "data": big("b"), "jobId": "big", "maxAttempts": 5, "backoff": 0})
	c.ok(M{"cmd": "PUSH", "queue": "small", "data": "small", "jobId": "small"})
	if apart, n := row("big"); !apart || n > 2048 {
		t.Fatalf("a big job's row: data apart %v, record of %d bytes", apart, n)
	}
	// Its record says it has no data in it: a build from before refuses
	// it as newer rather than read a job without data.
	versionOf := func(id string) int64 {
		t.Helper()
		var body []byte
		if err := conn.QueryRow(ctx, `SELECT body FROM `+jobs+` WHERE id = $1`, id).Scan(&body); err != nil {
			t.Fatal(err)
		}
		rr, err := newRecReader(body)
		if err != nil {
			t.Fatal(err)
		}
		return rr.i64()
	}
	if v, w := versionOf("big"), versionOf("small"); v != recordVersionApart || w != recordVersion {
		t.Fatalf("record versions: %d for a big job, %d for a small one; want %d and %d", v, w, recordVersionApart, recordVersion)
	}
	if apart, _ := row("small"); apart {
		t.Fatal("a small job's data is apart from its record")
	}
	for range 2 {
		pullFail("apart", "big")
		if got := dataOf("big"); got != big("b") {
			t.Fatalf("the big job's data after a FAIL: %.40v...", got)
		}
	}
	c.ok(M{"cmd": "Update", "id": "big", "data": big("c")})
	if got := dataOf("big"); got != big("c") {
		t.Fatalf("after an Update to other big data: %.40v...", got)
	}
	pullFail("apart", "big")
	if got := dataOf("big"); got != big("c") {
		t.Fatalf("the updated data after a FAIL: %.40v...", got)
	}
	c.ok(M{"cmd": "Update", "id": "big", "data": "now small"})
	if got := dataOf("big"); got != "now small" {
		t.Fatalf("after an Update to small data: %v", got)
	}
	if apart, _ := row("big"); apart {
		t.Fatal("small data left apart from the record")
	}

	// A row of the old form: the data in its record, the column NULL.
	c.ok(M{"cmd": "PUSH", "queue": "old", "data": big("o"), "jobId": "old", "maxAttempts": 5, "backoff": 0})
	var body, data []byte
	if err := conn.QueryRow(ctx, `SELECT body, data FROM `+jobs+` WHERE id = 'old'`).Scan(&body, &data); err != nil {
		t.Fatal(err)
	}
	j, err := decodeRecord(body)
	if err != nil {
		t.Fatal(err)
	}
	j.Data = data
	var e Enc
	encodeRecord(&e, j)
	if _, err := conn.Exec(ctx, `UPDATE `+jobs+` SET body = $1, data = NULL WHERE id = 'old'`, e.B); err != nil {
		t.Fatal(err)
	}
	if got := dataOf("old"); got != big("o") {
		t.Fatalf("a row of the old form read: %.40v...", got)
	}
	pullFail("old", "old")
	if got := dataOf("old"); got != big("o") {
		t.Fatalf("a row of the old form after a FAIL: %.40v...", got)
	}
	if apart, n := row("old"); !apart || n > 2048 {
		t.Fatalf("a row of the old form written again: data apart %v, record of %d bytes", apart, n)
	}

	// A flow's parent with big data takes its children's ids and keeps it.
	blob := big("p")
	link := M{"__parentId": "parent", "__parentQueue": "parents"}
	c.ok(M{"cmd": "PUSHF", "jobs": []any{
		M{"id": "child", "queue": "kids", "input": M{"parentId": "parent", "data": link}},
		M{"id": "parent", "queue": "parents", "input": M{"dependsOn": []any{"child"}, "childrenIds": []any{"child"}, "data": M{"blob": blob}}},
	}})
	token := tokensOf(t, c.ok(M{"cmd": "PULLB", "queue": "kids", "count": 1, "owner": "w"}))
	c.ok(M{"cmd": "ACK", "id": "child", "token": token["child"], "result": 1})
	parent, _ := dataOf("parent").(map[string]any)
	if parent["blob"] != blob {
		b, _ := json.Marshal(parent)
		t.Fatalf("the parent's data after its child: %.200s", b)
	}
}
