package main

// Handlers of the group commands: settings and figures of one group of a
// queue. The work is the engine's (GroupEngine: groups.go, pg_groups.go).

import (
	"context"
	"errors"
)

func validGroupID(m Map) (string, error) {
	raw := m.Get("groupId")
	if raw == nil {
		return "", errors.New("groupId is required")
	}
	g, err := raw.Str()
	if err != nil {
		return "", errors.New("groupId must be a string")
	}
	return g, checkGroupID(g)
}

// groupArgs name a queue's group, as every group command does.
type groupArgs struct{ queue, group string }

func readGroupArgs(r *Req) (groupArgs, error) {
	name, err := queueArg(r.m)
	if err != nil {
		return groupArgs{}, err
	}
	gid, err := validGroupID(r.m)
	if err != nil {
		return groupArgs{}, err
	}
	return groupArgs{name, gid}, nil
}

// readGroupRateLimit reads SetGroupRateLimit (its limit is checked first,
// as the reference does).
func readGroupRateLimit(r *Req) (groupArgs, groupLimit, error) {
	mx, err := positiveSafeInt(r.m, "max")
	if err != nil {
		return groupArgs{}, groupLimit{}, err
	}
	d, err := groupDuration(r.m)
	if err != nil {
		return groupArgs{}, groupLimit{}, err
	}
	a, err := readGroupArgs(r)
	return a, groupLimit{max: mx, duration: d}, err
}

// groupDuration reads a group's duration: a positive safe integer, as the
// reference checks it, and a time within PUSH's range for one (issue 25:
// every time a command takes has PUSH's bounds).
func groupDuration(m Map) (int64, error) {
	d, err := positiveSafeInt(m, "duration")
	if err != nil {
		return 0, err
	}
	return d, delayRule.check("duration", float64(d))
}

// readGroupNumber reads a group command with one positive safe integer
// (SetGroupConcurrency's concurrency, RateLimitGroup's duration, which is
// a time as well).
func readGroupNumber(r *Req, key string) (groupArgs, int64, error) {
	read := func(m Map) (int64, error) { return positiveSafeInt(m, key) }
	if key == "duration" {
		read = groupDuration
	}
	v, err := read(r.m)
	if err != nil {
		return groupArgs{}, 0, err
	}
	a, err := readGroupArgs(r)
	return a, v, err
}

// groupTTLArgs are GetGroupRateLimitTtl's.
type groupTTLArgs struct {
	groupArgs
	maxJobs float64
	hasMax  bool
}

func readGroupTTL(r *Req) (groupTTLArgs, error) {
	maxJobs, hasMax, err := r.m.Num("maxJobs")
	if err != nil {
		return groupTTLArgs{}, err
	}
	a, err := readGroupArgs(r)
	return groupTTLArgs{a, maxJobs, hasMax}, err
}

// dataInt answers {data: {key: v}}.
func (r *Req) dataInt(key string, v int64) error {
	e := r.field("data")
	e.MapHead(1)
	e.Str(key)
	e.Int(v)
	return nil
}

// dataBool answers {data: {key: v}}.
func (r *Req) dataBool(key string, v bool) error {
	e := r.field("data")
	e.MapHead(1)
	e.Str(key)
	e.Bool(v)
	return nil
}

// groupFigure answers a group figure: count is the engine's, read once the
// arguments are.
func groupFigure(r *Req, count func(a groupArgs) (int64, error)) error {
	a, err := readGroupArgs(r)
	if err != nil {
		return err
	}
	n, err := count(a)
	if err != nil {
		return err
	}
	return r.dataInt("count", n)
}

func cmdGetGroupJobsCount(r *Req) error {
	return groupFigure(r, func(a groupArgs) (int64, error) { return r.eng.GroupJobsCount(r.ctx(), a.queue, a.group) })
}

func cmdGetGroupActiveCount(r *Req) error {
	return groupFigure(r, func(a groupArgs) (int64, error) { return r.eng.GroupActiveCount(r.ctx(), a.queue, a.group) })
}

func cmdGetGroupsJobsCount(r *Req) error {
	name, err := queueArg(r.m)
	if err != nil {
		return err
	}
	n, err := r.eng.GroupsJobsCount(r.ctx(), name)
	if err != nil {
		return err
	}
	return r.dataInt("count", n)
}

func cmdSetGroupRateLimit(r *Req) error {
	a, l, err := readGroupRateLimit(r)
	if err != nil {
		return err
	}
	if err := r.eng.SetGroupRateLimit(r.ctx(), a.queue, a.group, l); err != nil {
		return err
	}
	return r.okID()
}

func cmdGetGroupRateLimit(r *Req) error {
	a, err := readGroupArgs(r)
	if err != nil {
		return err
	}
	l, err := r.eng.GroupRateLimit(r.ctx(), a.queue, a.group)
	if err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("limit")
	if l == nil {
		e.Nil()
		return nil
	}
	e.MapHead(2)
	e.Str("max")
	e.Int(l.max)
	e.Str("duration")
	e.Int(l.duration)
	return nil
}

// groupRemove answers RemoveGroupRateLimit and RemoveGroupConcurrency:
// how many settings went (0 or 1).
func groupRemove(r *Req, remove func(ctx context.Context, queue, group string) (bool, error)) error {
	a, err := readGroupArgs(r)
	if err != nil {
		return err
	}
	removed, err := remove(r.ctx(), a.queue, a.group)
	if err != nil {
		return err
	}
	return r.dataInt("removed", int64(b2i(removed)))
}

func cmdRemoveGroupRateLimit(r *Req) error { return groupRemove(r, r.eng.RemoveGroupRateLimit) }

func cmdRemoveGroupConcurrency(r *Req) error { return groupRemove(r, r.eng.RemoveGroupConcurrency) }

func cmdGetGroupRateLimitTTL(r *Req) error {
	a, err := readGroupTTL(r)
	if err != nil {
		return err
	}
	ttl, err := r.eng.GroupRateLimitTTL(r.ctx(), a.queue, a.group, a.maxJobs, a.hasMax)
	if err != nil {
		return err
	}
	return r.dataInt("ttl", ttl)
}

func cmdSetGroupConcurrency(r *Req) error {
	a, c, err := readGroupNumber(r, "concurrency")
	if err != nil {
		return err
	}
	if err := r.eng.SetGroupConcurrency(r.ctx(), a.queue, a.group, c); err != nil {
		return err
	}
	return r.okID()
}

func cmdGetGroupConcurrency(r *Req) error {
	a, err := readGroupArgs(r)
	if err != nil {
		return err
	}
	c, err := r.eng.GroupConcurrency(r.ctx(), a.queue, a.group)
	if err != nil {
		return err
	}
	e := r.field("data")
	e.MapHead(1)
	e.Str("concurrency")
	if c == 0 {
		e.Nil()
	} else {
		e.Int(c)
	}
	return nil
}

func cmdPauseGroup(r *Req) error  { return groupPauseCmd(r, true) }
func cmdResumeGroup(r *Req) error { return groupPauseCmd(r, false) }

func groupPauseCmd(r *Req, paused bool) error {
	a, err := readGroupArgs(r)
	if err != nil {
		return err
	}
	changed, err := r.eng.SetGroupPaused(r.ctx(), a.queue, a.group, paused)
	if err != nil {
		return err
	}
	return r.dataBool("changed", changed)
}

func cmdIsGroupPaused(r *Req) error {
	a, err := readGroupArgs(r)
	if err != nil {
		return err
	}
	paused, err := r.eng.IsGroupPaused(r.ctx(), a.queue, a.group)
	if err != nil {
		return err
	}
	return r.dataBool("paused", paused)
}

func cmdRateLimitGroup(r *Req) error {
	a, d, err := readGroupNumber(r, "duration")
	if err != nil {
		return err
	}
	if err := r.eng.RateLimitGroup(r.ctx(), a.queue, a.group, d); err != nil {
		return err
	}
	return r.okID()
}
