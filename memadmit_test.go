package main

// One admission for everything that grows what jobs hold (memlimit.go,
// commands.go): every command of the table is classified, a command that
// grows job memory is refused while the budget is spent, naming it, and
// the others go on without growing what jobs hold, in the three modes.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// admitSpec is what the walk expects of each command, written apart from
// the table so that a command's class is changed in two places on
// purpose: "grows" is admitted (refused while the budget is spent);
// "worker" is a worker's step, never refused, its growth bounded by its
// own limits; "weighed" is a worker's step that keeps what it carries,
// never refused but weighed; "steady" cannot grow what jobs hold.
var admitSpec = map[string]string{
	"Auth": "steady", "Hello": "steady", "Ping": "steady", "SubscribeEvents": "steady", "UnsubscribeEvents": "steady",

	"PUSH": "grows", "PUSHB": "grows", "PUSHF": "grows",
	"PULL": "worker", "PULLB": "worker", "ACK": "worker", "ACKB": "worker", "FAIL": "weighed",
	"JobHeartbeat": "worker", "JobHeartbeatB": "worker", "ExtendLock": "worker", "ExtendLocks": "worker",

	"GetJob": "steady", "GetJobByCustomId": "steady", "GetState": "steady", "GetResult": "steady",
	"GetJobCounts": "steady", "GetCountsPerPriority": "steady", "Count": "steady", "GetJobs": "steady",
	"GetProgress": "steady", "Progress": "grows", "AddLog": "grows", "GetLogs": "steady", "ClearLogs": "steady",
	"WaitJob": "steady",

	"Cancel": "steady", "Discard": "steady", "Promote": "steady", "PromoteJobs": "steady", "MoveToWait": "steady",
	"MoveToDelayed": "steady", "ChangeDelay": "steady", "ChangePriority": "steady", "Update": "grows",
	"Clean": "steady", "RetryCompleted": "grows",

	"GetDeduplicationJobId": "steady", "RemoveDeduplicationKey": "steady", "RemoveJobDeduplicationKey": "steady",

	"RateLimit": "steady", "RateLimitClear": "steady", "SetConcurrency": "steady", "ClearConcurrency": "steady",
	"GetQueueLimits": "steady", "SetStallConfig": "steady", "GetStallConfig": "steady",

	"GetChildrenValues": "steady", "GetFailedChildrenValues": "steady", "GetIgnoredChildrenFailures": "steady",
	"RemoveChildDependency": "steady", "RemoveUnprocessedChildren": "steady", "MoveToWaitingChildren": "worker",
	"UpdateParent": "grows",

	"Cron": "grows", "CronGet": "steady", "CronList": "steady", "CronDelete": "steady",

	"GetGroupJobsCount": "steady", "GetGroupsJobsCount": "steady", "GetGroupActiveCount": "steady",
	"SetGroupRateLimit": "steady", "GetGroupRateLimit": "steady", "RemoveGroupRateLimit": "steady",
	"GetGroupRateLimitTtl": "steady", "SetGroupConcurrency": "steady", "GetGroupConcurrency": "steady",
	"RemoveGroupConcurrency": "steady", "PauseGroup": "steady", "ResumeGroup": "steady", "IsGroupPaused": "steady",
	"RateLimitGroup": "steady",

	"Dlq": "steady", "RetryDlq": "grows", "PurgeDlq": "steady", "SetDlqConfig": "steady", "GetDlqConfig": "steady",
	"GetDlqStats": "steady", "RemoveDlqJob": "steady",

	"Pause": "steady", "Resume": "steady", "IsPaused": "steady", "Drain": "steady", "Obliterate": "steady",
	"ListQueues": "steady",

	"Stats": "steady", "Metrics": "steady", "RegisterWorker": "steady", "UnregisterWorker": "steady",
	"Heartbeat": "steady", "ListWorkers": "steady", "StorageStatus": "steady",

	"TrimEvents": "steady", "Prometheus": "steady", "CompactMemory": "steady", "DashboardOverview": "steady",
	"DashboardQueues": "steady", "DashboardQueue": "steady",

	"HandlerSet": "steady", "HandlerRemove": "steady", "HandlerList": "steady",

	"AddWebhook": "steady", "RemoveWebhook": "steady", "ListWebhooks": "steady", "SetWebhookEnabled": "steady",
}

// admitFx makes the state a command's fixture needs, through the wire,
// while the budget is open.
type admitFx struct {
	t *testing.T
	c *tclient
}

func (f *admitFx) waiting(q string, extra M) string { return push(f.t, f.c, q, extra) }

func (f *admitFx) active(q string) (id, tok string) {
	f.waiting(q, nil)
	return pullOwned(f.t, f.c, q, M{"timeout": 0})
}

func (f *admitFx) completed(q string) string {
	id, tok := f.active(q)
	f.c.ok(M{"cmd": "ACK", "id": id, "token": tok, "result": M{"r": 1}})
	return id
}

func (f *admitFx) dead(q string) string {
	id := f.waiting(q, M{"maxAttempts": 1})
	if got, tok := pullOwned(f.t, f.c, q, M{"timeout": 0}); got != id {
		f.t.Fatalf("pulled %s, want %s", got, id)
	} else {
		f.c.ok(M{"cmd": "FAIL", "id": id, "token": tok, "error": "boom"})
	}
	waitState(f.t, f.c, id, "failed", 10*time.Second)
	return id
}

// admitFixtures build, for each command, a request that does what the
// command is for (q is a queue of the command's own).
var admitFixtures = map[string]func(f *admitFx, q string) M{
	"Auth":              func(f *admitFx, q string) M { return M{"cmd": "Auth", "token": "t"} },
	"Hello":             func(f *admitFx, q string) M { return M{"cmd": "Hello", "protocolVersion": 3} },
	"Ping":              func(f *admitFx, q string) M { return M{"cmd": "Ping"} },
	"SubscribeEvents":   func(f *admitFx, q string) M { return M{"cmd": "SubscribeEvents", "queue": q} },
	"UnsubscribeEvents": func(f *admitFx, q string) M { return M{"cmd": "UnsubscribeEvents", "queue": q} },

	"PUSH": func(f *admitFx, q string) M {
		return M{"cmd": "PUSH", "queue": q, "name": "n", "data": M{"pad": strings.Repeat("p", 4096)}}
	},
	"PUSHB": func(f *admitFx, q string) M {
		return M{"cmd": "PUSHB", "queue": q, "jobs": []any{M{"name": "a", "data": 1}, M{"name": "b", "data": 2}}}
	},
	"PUSHF": func(f *admitFx, q string) M {
		return M{"cmd": "PUSHF", "jobs": []any{
			M{"id": "kid", "queue": q, "input": M{"name": "kid", "parentId": "top", "data": M{"__parentId": "top", "__parentQueue": q}}},
			M{"id": "top", "queue": q, "input": M{"name": "top", "dependsOn": []any{"kid"}, "childrenIds": []any{"kid"}, "data": M{"p": 1}}},
		}}
	},
	"PULL": func(f *admitFx, q string) M {
		f.waiting(q, nil)
		return M{"cmd": "PULL", "queue": q, "owner": "w", "timeout": 0}
	},
	"PULLB": func(f *admitFx, q string) M {
		f.waiting(q, nil)
		return M{"cmd": "PULLB", "queue": q, "owner": "w", "count": 5}
	},
	"ACK": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "ACK", "id": id, "token": tok, "result": M{"r": strings.Repeat("r", 4096)}}
	},
	"ACKB": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "ACKB", "ids": []any{id}, "tokens": []any{tok}, "results": []any{M{"r": 1}}}
	},
	"FAIL": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "FAIL", "id": id, "token": tok, "error": "it broke"}
	},
	"JobHeartbeat": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "JobHeartbeat", "id": id, "token": tok}
	},
	"JobHeartbeatB": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "JobHeartbeatB", "ids": []any{id}, "tokens": []any{tok}}
	},
	"ExtendLock": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "ExtendLock", "id": id, "token": tok, "duration": 30000}
	},
	"ExtendLocks": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "ExtendLocks", "ids": []any{id}, "tokens": []any{tok}, "durations": []any{30000}}
	},

	"GetJob": func(f *admitFx, q string) M { return M{"cmd": "GetJob", "id": f.waiting(q, nil)} },
	"GetJobByCustomId": func(f *admitFx, q string) M {
		f.waiting(q, M{"jobId": q + "-c"})
		return M{"cmd": "GetJobByCustomId", "customId": q + "-c"}
	},
	"GetState":             func(f *admitFx, q string) M { return M{"cmd": "GetState", "id": f.waiting(q, nil)} },
	"GetResult":            func(f *admitFx, q string) M { return M{"cmd": "GetResult", "id": f.completed(q)} },
	"GetJobCounts":         func(f *admitFx, q string) M { f.waiting(q, nil); return M{"cmd": "GetJobCounts", "queue": q} },
	"GetCountsPerPriority": func(f *admitFx, q string) M { f.waiting(q, nil); return M{"cmd": "GetCountsPerPriority", "queue": q} },
	"Count":                func(f *admitFx, q string) M { f.waiting(q, nil); return M{"cmd": "Count", "queue": q} },
	"GetJobs":              func(f *admitFx, q string) M { f.waiting(q, nil); return M{"cmd": "GetJobs", "queue": q} },
	"GetProgress":          func(f *admitFx, q string) M { return M{"cmd": "GetProgress", "id": f.waiting(q, nil)} },
	"Progress": func(f *admitFx, q string) M {
		id, _ := f.active(q)
		return M{"cmd": "Progress", "id": id, "progress": 50, "message": strings.Repeat("m", 4096)}
	},
	"AddLog": func(f *admitFx, q string) M {
		return M{"cmd": "AddLog", "id": f.waiting(q, nil), "message": strings.Repeat("l", 4096)}
	},
	"GetLogs": func(f *admitFx, q string) M { return M{"cmd": "GetLogs", "id": f.waiting(q, nil)} },
	"ClearLogs": func(f *admitFx, q string) M {
		id := f.waiting(q, nil)
		f.c.ok(M{"cmd": "AddLog", "id": id, "message": "x"})
		return M{"cmd": "ClearLogs", "id": id}
	},
	"WaitJob": func(f *admitFx, q string) M { return M{"cmd": "WaitJob", "id": f.completed(q), "timeout": 1000} },

	"Cancel": func(f *admitFx, q string) M { return M{"cmd": "Cancel", "id": f.waiting(q, nil)} },
	"Discard": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "Discard", "id": id, "token": tok}
	},
	"Promote": func(f *admitFx, q string) M { return M{"cmd": "Promote", "id": f.waiting(q, M{"delay": 60000})} },
	"PromoteJobs": func(f *admitFx, q string) M {
		f.waiting(q, M{"delay": 60000})
		return M{"cmd": "PromoteJobs", "queue": q}
	},
	"MoveToWait": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "MoveToWait", "id": id, "token": tok}
	},
	"MoveToDelayed": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "MoveToDelayed", "id": id, "token": tok, "delay": 60000}
	},
	"ChangeDelay": func(f *admitFx, q string) M {
		return M{"cmd": "ChangeDelay", "id": f.waiting(q, M{"delay": 60000}), "delay": 1000}
	},
	"ChangePriority": func(f *admitFx, q string) M {
		return M{"cmd": "ChangePriority", "id": f.waiting(q, nil), "priority": 5}
	},
	"Update": func(f *admitFx, q string) M {
		return M{"cmd": "Update", "id": f.waiting(q, nil), "data": M{"pad": strings.Repeat("u", 4096)}}
	},
	"Clean": func(f *admitFx, q string) M {
		f.completed(q)
		return M{"cmd": "Clean", "queue": q, "grace": 0, "state": "completed"}
	},
	"RetryCompleted": func(f *admitFx, q string) M { f.completed(q); return M{"cmd": "RetryCompleted", "queue": q} },

	"GetDeduplicationJobId": func(f *admitFx, q string) M {
		f.waiting(q, M{"deduplication": M{"id": "d"}})
		return M{"cmd": "GetDeduplicationJobId", "queue": q, "deduplicationId": "d"}
	},
	"RemoveDeduplicationKey": func(f *admitFx, q string) M {
		f.waiting(q, M{"deduplication": M{"id": "d"}})
		return M{"cmd": "RemoveDeduplicationKey", "queue": q, "deduplicationId": "d"}
	},
	"RemoveJobDeduplicationKey": func(f *admitFx, q string) M {
		return M{"cmd": "RemoveJobDeduplicationKey", "id": f.waiting(q, M{"deduplication": M{"id": "d"}})}
	},

	"RateLimit":        func(f *admitFx, q string) M { return M{"cmd": "RateLimit", "queue": q, "limit": 10} },
	"RateLimitClear":   func(f *admitFx, q string) M { return M{"cmd": "RateLimitClear", "queue": q} },
	"SetConcurrency":   func(f *admitFx, q string) M { return M{"cmd": "SetConcurrency", "queue": q, "limit": 3} },
	"ClearConcurrency": func(f *admitFx, q string) M { return M{"cmd": "ClearConcurrency", "queue": q} },
	"GetQueueLimits":   func(f *admitFx, q string) M { return M{"cmd": "GetQueueLimits", "queue": q} },
	"SetStallConfig": func(f *admitFx, q string) M {
		return M{"cmd": "SetStallConfig", "queue": q, "config": M{"stallInterval": 30000}}
	},
	"GetStallConfig": func(f *admitFx, q string) M { return M{"cmd": "GetStallConfig", "queue": q} },

	"GetChildrenValues":          func(f *admitFx, q string) M { return M{"cmd": "GetChildrenValues", "id": f.waiting(q, nil)} },
	"GetFailedChildrenValues":    func(f *admitFx, q string) M { return M{"cmd": "GetFailedChildrenValues", "id": f.waiting(q, nil)} },
	"GetIgnoredChildrenFailures": func(f *admitFx, q string) M { return M{"cmd": "GetIgnoredChildrenFailures", "id": f.waiting(q, nil)} },
	"RemoveChildDependency": func(f *admitFx, q string) M {
		p := f.waiting(q, M{"jobId": q + "-p"})
		f.waiting(q, M{"jobId": q + "-k", "parentId": p, "data": M{"__parentId": p, "__parentQueue": q}})
		return M{"cmd": "RemoveChildDependency", "id": q + "-k"}
	},
	"RemoveUnprocessedChildren": func(f *admitFx, q string) M {
		p := f.waiting(q, M{"jobId": q + "-p"})
		f.waiting(q, M{"jobId": q + "-k", "parentId": p, "data": M{"__parentId": p, "__parentQueue": q}})
		return M{"cmd": "RemoveUnprocessedChildren", "id": p}
	},
	"MoveToWaitingChildren": func(f *admitFx, q string) M {
		id, tok := f.active(q)
		return M{"cmd": "MoveToWaitingChildren", "id": id, "token": tok}
	},
	"UpdateParent": func(f *admitFx, q string) M {
		p := f.waiting(q, M{"jobId": q + "-p"})
		k := f.waiting(q+"k", M{"jobId": q + "-k"})
		return M{"cmd": "UpdateParent", "childId": k, "parentId": p}
	},

	"Cron": func(f *admitFx, q string) M {
		return M{"cmd": "Cron", "name": q, "queue": q, "data": M{"pad": strings.Repeat("c", 4096)}, "repeatEvery": 3600000}
	},
	"CronGet":    func(f *admitFx, q string) M { f.cron(q); return M{"cmd": "CronGet", "name": q} },
	"CronList":   func(f *admitFx, q string) M { f.cron(q); return M{"cmd": "CronList"} },
	"CronDelete": func(f *admitFx, q string) M { f.cron(q); return M{"cmd": "CronDelete", "name": q} },

	"GetGroupJobsCount":   func(f *admitFx, q string) M { return M{"cmd": "GetGroupJobsCount", "queue": q, "groupId": "g"} },
	"GetGroupsJobsCount":  func(f *admitFx, q string) M { return M{"cmd": "GetGroupsJobsCount", "queue": q} },
	"GetGroupActiveCount": func(f *admitFx, q string) M { return M{"cmd": "GetGroupActiveCount", "queue": q, "groupId": "g"} },
	"SetGroupRateLimit": func(f *admitFx, q string) M {
		return M{"cmd": "SetGroupRateLimit", "queue": q, "groupId": "g", "max": 5, "duration": 1000}
	},
	"GetGroupRateLimit":    func(f *admitFx, q string) M { return M{"cmd": "GetGroupRateLimit", "queue": q, "groupId": "g"} },
	"RemoveGroupRateLimit": func(f *admitFx, q string) M { return M{"cmd": "RemoveGroupRateLimit", "queue": q, "groupId": "g"} },
	"GetGroupRateLimitTtl": func(f *admitFx, q string) M { return M{"cmd": "GetGroupRateLimitTtl", "queue": q, "groupId": "g"} },
	"SetGroupConcurrency": func(f *admitFx, q string) M {
		return M{"cmd": "SetGroupConcurrency", "queue": q, "groupId": "g", "concurrency": 2}
	},
	"GetGroupConcurrency":    func(f *admitFx, q string) M { return M{"cmd": "GetGroupConcurrency", "queue": q, "groupId": "g"} },
	"RemoveGroupConcurrency": func(f *admitFx, q string) M { return M{"cmd": "RemoveGroupConcurrency", "queue": q, "groupId": "g"} },
	"PauseGroup":             func(f *admitFx, q string) M { return M{"cmd": "PauseGroup", "queue": q, "groupId": "g"} },
	"ResumeGroup":            func(f *admitFx, q string) M { return M{"cmd": "ResumeGroup", "queue": q, "groupId": "g"} },
	"IsGroupPaused":          func(f *admitFx, q string) M { return M{"cmd": "IsGroupPaused", "queue": q, "groupId": "g"} },
	"RateLimitGroup": func(f *admitFx, q string) M {
		return M{"cmd": "RateLimitGroup", "queue": q, "groupId": "g", "duration": 1000}
	},

	"Dlq":      func(f *admitFx, q string) M { f.dead(q); return M{"cmd": "Dlq", "queue": q} },
	"RetryDlq": func(f *admitFx, q string) M { f.dead(q); return M{"cmd": "RetryDlq", "queue": q} },
	"PurgeDlq": func(f *admitFx, q string) M { f.dead(q); return M{"cmd": "PurgeDlq", "queue": q} },
	"SetDlqConfig": func(f *admitFx, q string) M {
		return M{"cmd": "SetDlqConfig", "queue": q, "config": M{"maxEntries": 100}}
	},
	"GetDlqConfig": func(f *admitFx, q string) M { return M{"cmd": "GetDlqConfig", "queue": q} },
	"GetDlqStats":  func(f *admitFx, q string) M { f.dead(q); return M{"cmd": "GetDlqStats", "queue": q} },
	"RemoveDlqJob": func(f *admitFx, q string) M { return M{"cmd": "RemoveDlqJob", "queue": q, "jobId": f.dead(q)} },

	"Pause":      func(f *admitFx, q string) M { return M{"cmd": "Pause", "queue": q} },
	"Resume":     func(f *admitFx, q string) M { return M{"cmd": "Resume", "queue": q} },
	"IsPaused":   func(f *admitFx, q string) M { return M{"cmd": "IsPaused", "queue": q} },
	"Drain":      func(f *admitFx, q string) M { f.waiting(q, nil); return M{"cmd": "Drain", "queue": q} },
	"Obliterate": func(f *admitFx, q string) M { f.waiting(q, nil); return M{"cmd": "Obliterate", "queue": q} },
	"ListQueues": func(f *admitFx, q string) M { return M{"cmd": "ListQueues"} },

	"Stats":   func(f *admitFx, q string) M { return M{"cmd": "Stats"} },
	"Metrics": func(f *admitFx, q string) M { return M{"cmd": "Metrics"} },
	"RegisterWorker": func(f *admitFx, q string) M {
		return M{"cmd": "RegisterWorker", "name": "w", "queues": []any{q}, "workerId": q}
	},
	"UnregisterWorker": func(f *admitFx, q string) M { return M{"cmd": "UnregisterWorker", "workerId": q} },
	"Heartbeat":        func(f *admitFx, q string) M { return M{"cmd": "Heartbeat", "id": q} },
	"ListWorkers":      func(f *admitFx, q string) M { return M{"cmd": "ListWorkers"} },
	"StorageStatus":    func(f *admitFx, q string) M { return M{"cmd": "StorageStatus"} },

	"TrimEvents":        func(f *admitFx, q string) M { return M{"cmd": "TrimEvents", "queue": q, "maxLength": 10} },
	"Prometheus":        func(f *admitFx, q string) M { return M{"cmd": "Prometheus"} },
	"CompactMemory":     func(f *admitFx, q string) M { return M{"cmd": "CompactMemory"} },
	"DashboardOverview": func(f *admitFx, q string) M { return M{"cmd": "DashboardOverview"} },
	"DashboardQueues":   func(f *admitFx, q string) M { return M{"cmd": "DashboardQueues"} },
	"DashboardQueue": func(f *admitFx, q string) M {
		f.waiting(q, nil)
		return M{"cmd": "DashboardQueue", "queue": q, "includeJobs": true}
	},

	"HandlerSet":    func(f *admitFx, q string) M { return M{"cmd": "HandlerSet", "queue": q, "url": "http://127.0.0.1:9/h"} },
	"HandlerRemove": func(f *admitFx, q string) M { return M{"cmd": "HandlerRemove", "queue": q} },
	"HandlerList":   func(f *admitFx, q string) M { return M{"cmd": "HandlerList"} },

	"AddWebhook": func(f *admitFx, q string) M {
		return M{"cmd": "AddWebhook", "url": "http://127.0.0.1:9/h", "events": []any{"job.completed"}, "queue": q}
	},
	"RemoveWebhook":     func(f *admitFx, q string) M { return M{"cmd": "RemoveWebhook", "webhookId": q} },
	"ListWebhooks":      func(f *admitFx, q string) M { return M{"cmd": "ListWebhooks"} },
	"SetWebhookEnabled": func(f *admitFx, q string) M { return M{"cmd": "SetWebhookEnabled", "id": q, "enabled": false} },
}

func (f *admitFx) cron(name string) {
	f.c.ok(M{"cmd": "Cron", "name": name, "queue": name, "data": M{"x": 1}, "repeatEvery": 3600000})
}

// jobHeldBytes is what jobs hold in a memory engine, by its own weights:
// every job's size (data and every string it carries, timeline errors
// included), its children's values, and the results and logs caches.
func jobHeldBytes(b *MemEngine) int64 {
	for _, s := range b.shards {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	var n int64
	for i := range b.idx {
		p := &b.idx[i]
		p.mu.Lock()
		for _, j := range p.t.jobs {
			if j != nil {
				n += j.size() + kvsBytes(j.cold().childValues) + kvsBytes(j.cold().failedKids) + kvsBytes(j.cold().ignoredKids)
			}
		}
		p.mu.Unlock()
	}
	locked(&b.rmu, func() { n += b.results.Bytes() })
	locked(&b.lmu, func() { n += b.logs.Bytes() })
	return n
}

// admitServer is a server in this process whose budget the test holds:
// jobs in memory, in SQLite or in PostgreSQL.
type admitServer struct {
	b    *Broker
	m    *MemEngine // nil in PostgreSQL mode
	srv  *Server    // nil in PostgreSQL mode
	addr string
	pg   bool
}

const admitBudget = 256 << 20

func startAdmitServer(t *testing.T, mode string) *admitServer {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	setup := func(b *Broker) { b.mem = newMemLimit(admitBudget, mode != "postgres", log) }
	if mode == "postgres" {
		p := startPGInProcessWith(t, testPGURL(), pgTestNamespace(t), nil, pgOptions{}, setup)
		return &admitServer{b: p.b, addr: p.addr, pg: true}
	}
	var b *MemEngine
	if mode == "sqlite" {
		var st *SQLiteStore
		b, st, _ = openTestStore(t, filepath.Join(t.TempDir(), "q.db"))
		t.Cleanup(func() { st.Close() })
	} else {
		b = NewMemEngine(2, nil)
	}
	setup(b.Broker)
	srv := memServer(b, nil, log)
	addr := serveTest(t, srv, b.Close)
	return &admitServer{b: b.Broker, m: b, srv: srv, addr: addr}
}

// refusing sets the budget spent (true) or open, as the watch would.
func (s *admitServer) refusing(on bool) {
	s.b.mem.admitted.Store(0)
	s.b.mem.live.Store(0)
	s.b.mem.refusing.Store(on)
}

// held is jobHeldBytes, once the flow goroutine has applied what it
// took; -1 in PostgreSQL mode, where jobs are not in the process.
func (s *admitServer) held() int64 {
	if s.pg {
		return -1
	}
	s.m.flowSettle()
	return jobHeldBytes(s.m)
}

// reqBytes is what a request carries, encoded.
func reqBytes(t *testing.T, m M) int64 {
	var e Enc
	if err := e.Any(m); err != nil {
		t.Fatal(err)
	}
	return int64(len(e.B))
}

// memRefusal says whether an answer is the budget's refusal, naming
// --max-memory and its value.
func memRefusal(a M) bool {
	msg, _ := a["error"].(string)
	return a["ok"] == false && strings.Contains(msg, "--max-memory") && strings.Contains(msg, sizeText(admitBudget))
}

// TestAdmissionWalksCommandTable: every command of the table is
// classified, with the class admitSpec gives it, and has a fixture; while
// the budget is spent, every command that grows what jobs hold is refused
// naming the budget and changes nothing, and every other one goes on, the
// steady ones holding no more than before and a worker's step no more
// than three times what it carries (measured by jobHeldBytes); once the budget is open,
// each growing fixture is accepted. Memory, SQLite and PostgreSQL modes;
// an Update through a virtual connection (MCP tools, URL handlers) is
// refused too.
func TestAdmissionWalksCommandTable(t *testing.T) {
	t.Parallel()
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if admitSpec[name] == "" {
			t.Errorf("command %s is not classified in admitSpec (grows, worker, weighed or steady)", name)
		}
		if admitFixtures[name] == nil {
			t.Errorf("command %s has no fixture in admitFixtures", name)
		}
	}
	class := map[string]memUse{"grows": memGrows, "worker": memWorker, "weighed": memWorkerGrows, "steady": memSteady}
	for _, name := range names {
		if got, want := commands[name].mem, class[admitSpec[name]]; got != want {
			t.Errorf("command %s has memory class %d in the table, admitSpec says %s (%d)", name, got, admitSpec[name], want)
		}
	}
	// A line given no class is admitted as growing: forgetting one refuses
	// too much, never lets memory in.
	m := newMemLimit(admitBudget, true, nil)
	m.refusing.Store(true)
	if _, err := m.admitRequest(command{run: cmdPing}.mem, Map{}); err == nil {
		t.Error("a command without a memory class was let in while the budget is spent")
	}
	for name := range admitSpec {
		if !slices.Contains(names, name) {
			t.Errorf("admitSpec classifies %s, which is not in the command table", name)
		}
	}
	if t.Failed() {
		return
	}
	for _, mode := range []string{"memory", "sqlite", "postgres"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "postgres" {
				needPG(t)
			}
			s := startAdmitServer(t, mode)
			c := dial(t, s.addr)
			f := &admitFx{t: t, c: c}
			for _, name := range names {
				q := "adm-" + strings.ToLower(name)
				s.refusing(false)
				req := admitFixtures[name](f, q)
				before := s.held()
				s.refusing(true)
				a := c.call(req)
				after := s.held()
				s.refusing(false)
				switch admitSpec[name] {
				case "grows":
					if !memRefusal(a) {
						t.Errorf("%s grows what jobs hold but was not refused while the budget is spent: %v", name, a)
						continue
					}
					if after != before {
						t.Errorf("%s was refused but jobs hold %d bytes, %d before", name, after, before)
					}
					if a := c.call(req); a["ok"] != true {
						t.Errorf("%s with the budget open: %v (its fixture must be accepted)", name, a)
					}
				case "worker", "weighed", "steady":
					if memRefusal(a) {
						t.Errorf("%s (%s) was refused by the budget: %v", name, admitSpec[name], a)
					}
					if admitSpec[name] == "steady" && after > before {
						t.Errorf("%s (steady) made jobs hold %d bytes more: %v", name, after-before, a)
					}
					// A worker's step adds no more than what it carries (a
					// FAIL's error lands in the timeline, the attempts and
					// the job's last error: three times).
					if admitSpec[name] != "steady" && after-before > 3*reqBytes(t, req) {
						t.Errorf("%s (worker) made jobs hold %d bytes more, over 3 times its %d bytes", name, after-before, reqBytes(t, req))
					}
				}
			}
			if s.srv == nil {
				return
			}
			// The path of the MCP tools and the URL handlers (a virtual
			// connection) is the same dispatch.
			id := f.waiting("adm-local", nil)
			s.refusing(true)
			body, err := s.srv.localSend(context.Background(), "Update", func(e *Enc) int {
				e.Str("id")
				e.Str(id)
				e.Str("data")
				e.Bin(make([]byte, 1<<20))
				return 2
			})
			s.refusing(false)
			if err != nil {
				t.Fatal(err)
			}
			if a, err := Decode(body); err != nil || !memRefusal(a.(map[string]any)) {
				t.Errorf("an Update through a virtual connection while the budget is spent: %v %v", a, err)
			}
		})
	}
}

// What a worker's step adds is bounded inside the budget: the results and
// logs caches are fitted to an eighth of it each, and a repeating job's
// next run, never refused, is weighed so that what may be refused is.
func TestMemLimitWorkerBounds(t *testing.T) {
	t.Parallel()
	b := NewMemEngine(1, nil)
	t.Cleanup(b.Close)
	b.mem = newMemLimit(64<<20, true, nil)
	b.fitCaches()
	big := make(Raw, 3<<20)
	for i := range 10 {
		b.setResult(keyOf("r"+itoa(int64(i))), big)
		b.lmu.Lock()
		b.logs.Put("l"+itoa(int64(i)), []LogEntry{{Level: "info", Message: big}})
		b.lmu.Unlock()
	}
	share := int64(64<<20) / cacheShare
	if n := b.results.Bytes(); n > share {
		t.Errorf("the results cache holds %d bytes, over its share of the budget (%d)", n, share)
	}
	if n := b.logs.Bytes(); n > share {
		t.Errorf("the logs cache holds %d bytes, over its share of the budget (%d)", n, share)
	}
	// Without a budget, the caches keep their own bounds.
	nb := NewMemEngine(1, nil)
	t.Cleanup(nb.Close)
	nb.fitCaches()
	if nb.results.maxBytes != maxResultsBytes || nb.logs.maxBytes != maxLogsBytes {
		t.Errorf("no budget: caches bounded at %d and %d", nb.results.maxBytes, nb.logs.maxBytes)
	}

	m := newMemLimit(100<<20, true, nil)
	m.took(79 << 20)
	if _, err := m.admitRequest(memGrows, Map{}); err != nil {
		t.Fatalf("under the mark: %v", err)
	}
	m.took(2 << 20)
	if _, err := m.admitRequest(memGrows, Map{}); err == nil {
		t.Fatal("jobs weighed past the mark, yet a growing command was let in")
	}
	if _, err := m.admitRequest(memWorker, Map{}); err != nil {
		t.Fatalf("a worker's step was refused: %v", err)
	}
	// A FAIL is never refused, but what it carries is weighed: in the
	// estimate while it runs, and after.
	fail := Map{}
	{
		var e Enc
		e.Any(M{"cmd": "FAIL", "id": "x", "error": strings.Repeat("e", 1<<20)})
		fail, _ = ParseMap(e.B, nil)
	}
	before, running := m.estimate(), m.inflight.Load()
	adm, err := m.admitRequest(memWorkerGrows, fail)
	w := adm.weight
	if err != nil || w < 1<<20 || adm.bytes != w {
		t.Fatalf("a FAIL of 1 MiB while refusing: %+v, %v", adm, err)
	}
	if m.estimate() != before+w {
		t.Fatalf("a FAIL under way: estimate %d, want %d", m.estimate(), before+w)
	}
	m.settle(adm, true)
	if m.estimate() != before+w || m.inflight.Load() != running {
		t.Fatalf("a FAIL done: estimate %d (want %d), in flight %d (want %d)", m.estimate(), before+w, m.inflight.Load(), running)
	}
	pg := newMemLimit(100<<20, false, nil)
	pg.took(1 << 30)
	if pg.refusing.Load() {
		t.Error("PostgreSQL mode: jobs that live in the database were weighed")
	}
}

// TestMemLimitInFlight: requests let in are weighed from the moment they
// are, not once their handlers finish, so many sent at once pass only
// until their weight together reaches the mark. Before, with 79 MiB of a
// 100 MiB budget's 80 MiB mark held, ten 9.9 MB Updates let in together
// all passed (none had finished, so none was weighed): 178 MiB. What is
// in flight is a request's bytes; a request that fails gives them back,
// one that made what it asked has its weight kept.
func TestMemLimitInFlight(t *testing.T) {
	t.Parallel()
	m := newMemLimit(100<<20, true, nil)
	m.took(70 << 20)
	update := func() Map {
		var e Enc
		e.Any(M{"cmd": "Update", "id": "x", "data": make([]byte, 9_900_000)})
		u, _ := ParseMap(e.B, nil)
		return u
	}()
	var let []admission
	for range 10 {
		adm, err := m.admitRequest(memGrows, update)
		if err != nil {
			if !strings.Contains(err.Error(), "--max-memory") {
				t.Fatalf("refusal: %v", err)
			}
			continue
		}
		let = append(let, adm)
	}
	// 70 MiB held: the first takes the estimate to 79.4 MiB, the second
	// past the 80 MiB mark (let in), the rest are refused.
	if len(let) != 2 {
		t.Fatalf("%d of 10 Updates let in at once, want 2", len(let))
	}
	// One fails (a bad field): its weight goes; one made its change.
	m.settle(let[0], false)
	m.settle(let[1], true)
	if m.inflight.Load() != 0 || m.admitted.Load() != 70<<20+let[1].weight {
		t.Fatalf("settled: in flight %d, admitted %d, want 0 and %d", m.inflight.Load(), m.admitted.Load(), 70<<20+let[1].weight)
	}
}

// TestFailWeighed: a FAIL and the record a parent keeps of its failed
// child are weighed into the estimate (never refused). Before, a FAIL's
// error, kept in the job's timeline and attempts and in its parent's
// record, was not weighed at all: FAILs between two collections grew
// what jobs hold unseen.
func TestFailWeighed(t *testing.T) {
	t.Parallel()
	s := startAdmitServer(t, "memory")
	c := dial(t, s.addr)
	q := "fw"
	c.ok(M{"cmd": "PUSHF", "jobs": []any{
		M{"id": "kid", "queue": q, "input": M{"parentId": "par", "maxAttempts": 1, "continueParentOnFailure": true,
			"data": M{"__parentId": "par", "__parentQueue": q}}},
		M{"id": "par", "queue": q, "input": M{"dependsOn": []any{"kid"}, "childrenIds": []any{"kid"}, "data": M{}}},
	}})
	id := str(t, sub(t, c.ok(M{"cmd": "PULL", "queue": q}), "job"), "id")
	before := s.b.mem.estimate()
	msg := strings.Repeat("e", 60_000)
	c.ok(M{"cmd": "FAIL", "id": id, "error": msg})
	eventually(t, 10*time.Second, "the parent's record of its failed child", func() (bool, string) {
		v := c.ok(M{"cmd": "GetFailedChildrenValues", "id": "par"})["values"]
		m, _ := v.(map[string]any)
		return len(m) == 1, fmt.Sprint(v)
	})
	// The FAIL's bytes, and the parent's record of the error.
	if got := s.b.mem.estimate() - before; got < 2*int64(len(msg)) {
		t.Fatalf("a FAIL of a %d-byte error weighed %d bytes, want at least %d", len(msg), got, 2*len(msg))
	}
	if n := s.b.mem.inflight.Load(); n != 0 {
		t.Fatalf("%d bytes still in flight after the FAIL", n)
	}
}

// TestMoveToWaitOfFailedRefused: MoveToWait of a failed job is a retry
// out of the dead-letter queue, refused while the budget is spent as
// RetryDlq is; MoveToWait of an active job (giving it back) is not.
// Before, the retry passed as a steady command.
func TestMoveToWaitOfFailedRefused(t *testing.T) {
	t.Parallel()
	s := startAdmitServer(t, "memory")
	c := dial(t, s.addr)
	failed := str(t, c.ok(M{"cmd": "PUSH", "queue": "mw", "data": M{}, "maxAttempts": 1}), "id")
	c.ok(M{"cmd": "PULL", "queue": "mw"})
	c.ok(M{"cmd": "FAIL", "id": failed, "error": "x"})
	active := str(t, c.ok(M{"cmd": "PUSH", "queue": "mw2", "data": M{}}), "id")
	c.ok(M{"cmd": "PULL", "queue": "mw2"})
	s.refusing(true)
	if a := c.call(M{"cmd": "MoveToWait", "id": failed}); !memRefusal(a) {
		t.Fatalf("MoveToWait of a failed job while the budget is spent: %v", a)
	}
	if a := c.call(M{"cmd": "MoveToWait", "id": active}); a["ok"] != true {
		t.Fatalf("MoveToWait of an active job while the budget is spent: %v", a)
	}
	s.refusing(false)
	c.ok(M{"cmd": "MoveToWait", "id": failed})
	if st := c.ok(M{"cmd": "GetState", "id": failed})["state"]; st != "waiting" {
		t.Fatalf("the failed job moved once the budget is open: %v", st)
	}
}

// requestWeight bounds what a request can make jobs hold: its bytes, and
// a job's own cost for each job a PUSHB or PUSHF may make.
func TestRequestWeight(t *testing.T) {
	t.Parallel()
	parse := func(m M) Map {
		var e Enc
		if err := e.Any(m); err != nil {
			t.Fatal(err)
		}
		pm, err := ParseMap(e.B, nil)
		if err != nil {
			t.Fatal(err)
		}
		return pm
	}
	jobs := make([]any, 1000)
	for i := range jobs {
		jobs[i] = M{}
	}
	req := parse(M{"cmd": "PUSHB", "queue": "q", "jobs": jobs})
	if w := requestWeight(req); w < 1000*jobMemOverhead {
		t.Errorf("1000 empty jobs weigh %d, under their own cost", w)
	}
	data := strings.Repeat("d", 1<<20)
	up := parse(M{"cmd": "Update", "id": "x", "data": data})
	if w := requestWeight(up); w < int64(len(data)) {
		t.Errorf("an Update of %d bytes weighs %d", len(data), w)
	}
}

// A growing command refused for a bad field made nothing and adds nothing
// to the estimate: a request cannot start the budget refusing everyone's
// pushes (until the next collection) by claiming half a million jobs it
// never makes, 256 MB by their own cost. One that made something is
// weighed.
func TestRefusedCommandLeavesNoWeight(t *testing.T) {
	t.Parallel()
	s := startAdmitServer(t, "memory")
	c := dial(t, s.addr)
	s.refusing(false)
	ints := make([]any, 500000)
	for i := range ints {
		ints[i] = 1
	}
	for _, req := range []M{
		{"cmd": "Update", "id": "nope", "data": 1, "jobs": ints},
		{"cmd": "PUSHB", "queue": "gb", "jobs": ints},
	} {
		if a := c.call(req); a["ok"] != false || memRefusal(a) {
			t.Fatalf("%s: %v, want its own refusal", req["cmd"], a)
		}
		if n := s.b.mem.admitted.Load(); n != 0 {
			t.Errorf("%s refused for a bad field left %d bytes in the estimate", req["cmd"], n)
		}
		if s.b.mem.refusing.Load() {
			t.Errorf("%s refused for a bad field started the budget refusing", req["cmd"])
		}
		s.refusing(false)
	}
	id := push(t, c, "gb", nil)
	if n := s.b.mem.admitted.Load(); n < jobMemOverhead {
		t.Errorf("a PUSH weighs %d in the estimate", n)
	}
	c.ok(M{"cmd": "Update", "id": id, "data": strings.Repeat("u", 1<<20)})
	if n := s.b.mem.admitted.Load(); n < 1<<20 {
		t.Errorf("after an Update of 1 MiB the estimate holds %d", n)
	}
}
