package main

// The MCP flow tools: a tree, a chain and a fan-out/fan-in, planned here
// as the official client plans them (ids made before the push, links in
// each job and in its data) and pushed with one PUSHF, all or nothing;
// and a flow read back from a job down its children.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Bounds on a flow, the official client's.
const (
	mcpFlowMaxDepth = 100
	mcpFlowMaxJobs  = 10_000
)

// flowStep is a step or node of a flow as a tool receives it.
type flowStep struct {
	Name      string                     `json:"name"`
	QueueName string                     `json:"queueName"`
	Data      json.RawMessage            `json:"data"`
	Opts      map[string]json.RawMessage `json:"opts"`
	Children  []*flowStep                `json:"children"`
}

// plannedJob is one job of a PUSHF: its id, queue, and what PUSH would
// take for it.
type plannedJob struct {
	id, queue, name string
	data            json.RawMessage
	extra           []flowExtra // data keys the flow adds
	opts            map[string]json.RawMessage
	dependsOn       []string
	childrenIds     []string
	parentID        string
}

// flowExtra is a key the flow adds to a job's data; a nil value is null.
type flowExtra struct {
	key string
	val any // string, []string or nil
}

func (s *flowStep) check(depth int) error {
	if s.Name == "" || len([]rune(s.Name)) > 256 {
		return errors.New("flow job name must be a non-empty string of at most 256 characters")
	}
	if s.QueueName == "" {
		return errors.New("flow queueName is required")
	}
	if depth > mcpFlowMaxDepth {
		return fmt.Errorf("flow exceeds the %d level depth limit", mcpFlowMaxDepth)
	}
	if len(s.Data) > 0 && string(s.Data) != "null" {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(s.Data, &keys); err != nil {
			return errors.New("flow job data must be an object")
		}
		for k := range keys {
			if strings.HasPrefix(k, "__") {
				return fmt.Errorf("flow job data key is reserved: %s", k)
			}
		}
	}
	return nil
}

func (s *flowStep) job(id string) *plannedJob {
	return &plannedJob{id: id, queue: s.QueueName, name: s.Name, data: s.Data, opts: s.Opts}
}

// encode writes the job as PUSHF takes it: {id, queue, input}.
func (p *plannedJob) encode(e *Enc) error {
	mp := e.BeginMap()
	mp.Key("id").Str(p.id)
	mp.Key("queue").Str(p.queue)
	in := mp.Key("input").BeginMap()
	in.Key("name").Str(p.name)
	if err := p.encodeData(in.Key("data")); err != nil {
		return err
	}
	for _, o := range [][2]string{{"priority", "priority"}, {"delay", "delay"}, {"attempts", "maxAttempts"}} {
		if v, ok := p.opts[o[0]]; ok {
			r, err := jsonToMsgpack(v)
			if err != nil {
				return err
			}
			in.Key(o[1]).Raw(r)
		}
	}
	if len(p.dependsOn) > 0 {
		encVal(in.Key("dependsOn"), p.dependsOn)
	}
	if len(p.childrenIds) > 0 {
		encVal(in.Key("childrenIds"), p.childrenIds)
	}
	if p.parentID != "" {
		in.Key("parentId").Str(p.parentID)
	}
	in.Key("removeOnComplete").Bool(false)
	in.Key("removeOnFail").Bool(false)
	in.End()
	mp.End()
	return nil
}

// encodeData writes {...data, ...extra}.
func (p *plannedJob) encodeData(e *Enc) error {
	mp := e.BeginMap()
	if len(p.data) > 0 && string(p.data) != "null" {
		r, err := jsonToMsgpack(p.data)
		if err != nil {
			return err
		}
		m, err := ParseMap(r, nil)
		if err != nil {
			return err
		}
		for _, f := range m.Fields {
			mp.Key(string(f.Key)).Raw(f.Val)
		}
	}
	for _, x := range p.extra {
		v := mp.Key(x.key)
		switch val := x.val.(type) {
		case nil:
			v.Nil()
		default:
			encVal(v, val)
		}
	}
	mp.End()
	return nil
}

// pushFlow sends the planned jobs as one PUSHF and checks that every one
// was committed.
func (b *mcpBackend) pushFlow(ctx context.Context, jobs []*plannedJob) error {
	if len(jobs) == 0 {
		return nil
	}
	m, err := b.call(ctx, "PUSHF", "jobs", func(e *Enc) error {
		e.ArrayHead(len(jobs))
		for _, j := range jobs {
			if err := j.encode(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := refusal(m, "Failed to add flow"); err != nil {
		return err
	}
	data, _, _ := m.Map("data")
	got, _, _ := data.Array("jobs")
	if len(got) != len(jobs) {
		return errors.New("Invalid PUSHF response: committed job snapshots are missing")
	}
	want := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		want[j.id] = true
	}
	for _, r := range got {
		j, _ := ParseMap(r, nil)
		id := rawString(j.Get("id"))
		if !want[id] {
			return errors.New("Invalid PUSHF response: committed job IDs do not match the request")
		}
		delete(want, id)
	}
	return nil
}

func mcpFlowTools() []*mcpTool {
	jobOpts := sObject("Optional job settings",
		opt("priority", sNum("Priority (higher = processed first)")),
		opt("delay", sNum("Delay in ms before processing")),
		opt("attempts", sNum("Max retry attempts")))
	step := sObject("", req("name", sStr("Job name/type")), req("queueName", sStr("Queue to run in")),
		req("data", sRecord("Job payload data")), opt("opts", jobOpts))
	node := sObject("", req("name", sStr("Job name/type")), req("queueName", sStr("Queue to run in")),
		opt("data", sRecord("Job payload data")), opt("opts", jobOpts),
		opt("children", sArray(&schema{ref: "flowJob"}, "Child jobs (processed BEFORE parent)")))
	tree := toolSchema{top: sObject("", req("name", sStr("Root job name/type")), req("queueName", sStr("Root queue name")),
		opt("data", sRecord("Root job payload")), opt("opts", jobOpts),
		opt("children", sArray(&schema{ref: "flowJob"}, "Child jobs (processed BEFORE this job)"))),
		defs: map[string]*schema{"flowJob": node}}
	return []*mcpTool{
		{name: "bunqueue_add_flow", desc: "Add a tree of jobs (as BullMQ v5 flows): children are processed BEFORE their parent. For dependency graphs.",
			in: tree,
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				var root flowStep
				if err := json.Unmarshal(a.all, &root); err != nil {
					return mcpResult{}, err
				}
				var jobs []*plannedJob
				out, err := planTree(&root, nil, 0, &jobs)
				if err != nil {
					return mcpResult{}, err
				}
				if err := b.pushFlow(ctx, jobs); err != nil {
					return mcpResult{}, err
				}
				return prettyText(out)
			}},
		{name: "bunqueue_add_flow_chain", desc: "Add a pipeline of jobs: step[0], then step[1], then step[2]; each waits for the one before it to complete.",
			in: props(req("steps", sArray(step, "Steps executed in order, each depending on the previous").nonEmpty())),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				var steps []*flowStep
				if err := json.Unmarshal(a.json("steps"), &steps); err != nil {
					return mcpResult{}, err
				}
				if err := checkFlat(steps); err != nil {
					return mcpResult{}, err
				}
				jobs := make([]*plannedJob, len(steps))
				ids := make([][]byte, len(steps))
				for i, s := range steps {
					j := s.job(newID())
					if i == 0 {
						j.extra = []flowExtra{{"__flowParentId", nil}}
					} else {
						prev := jobs[i-1]
						j.extra = []flowExtra{{"__flowParentId", prev.id}, {"__parentId", prev.id}, {"__parentQueue", prev.queue}}
						j.dependsOn = []string{prev.id}
					}
					jobs[i] = j
					ids[i] = jsonStr(j.id)
				}
				if err := b.pushFlow(ctx, jobs); err != nil {
					return mcpResult{}, err
				}
				return prettyText(newJSONObj().json("jobIds", jsonArr(ids)).close())
			}},
		{name: "bunqueue_add_flow_bulk_then", desc: "Fan out, then in: parallel jobs, and a final job that runs once ALL of them have completed.",
			in: props(req("parallel", sArray(step, "Jobs that run in parallel").nonEmpty()),
				req("final", withDesc(step, "Final job that runs after all parallel jobs complete"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				var parallel []*flowStep
				var final flowStep
				if err := json.Unmarshal(a.json("parallel"), &parallel); err != nil {
					return mcpResult{}, err
				}
				if err := json.Unmarshal(a.json("final"), &final); err != nil {
					return mcpResult{}, err
				}
				if err := checkFlat(append(parallel[:len(parallel):len(parallel)], &final)); err != nil {
					return mcpResult{}, err
				}
				jobs := make([]*plannedJob, 0, len(parallel)+1)
				var ids []string
				for _, s := range parallel {
					j := s.job(newID())
					jobs = append(jobs, j)
					ids = append(ids, j.id)
				}
				last := final.job(newID())
				for _, j := range jobs {
					j.extra = []flowExtra{{"__parentId", last.id}, {"__parentQueue", last.queue}}
					j.parentID = last.id
				}
				last.extra = []flowExtra{{"__flowParentIds", ids}, {"__childrenIds", ids}}
				last.dependsOn, last.childrenIds = ids, ids
				jobs = append(jobs, last)
				if err := b.pushFlow(ctx, jobs); err != nil {
					return mcpResult{}, err
				}
				list := make([][]byte, len(ids))
				for i, id := range ids {
					list[i] = jsonStr(id)
				}
				return prettyText(newJSONObj().json("parallelIds", jsonArr(list)).str("finalId", last.id).close())
			}},
		{name: "bunqueue_get_flow", desc: "Read a flow's tree down from a job, with its children.",
			in: props(req("jobId", sStr("Job ID to get flow tree for")), req("queueName", sStr("Queue name where the job is located")),
				opt("depth", sNum("Max traversal depth (default: 10)")), opt("maxChildren", sNum("Max children per level"))),
			run: func(ctx context.Context, b *mcpBackend, a mcpArgs) (mcpResult, error) {
				depth, ok := a.num("depth")
				if !ok {
					depth = 10
				}
				maxChildren, ok := a.num("maxChildren")
				if !ok {
					maxChildren = math.Inf(1)
				}
				for _, l := range []struct {
					name string
					v    float64
				}{{"depth", depth}, {"maxChildren", maxChildren}} {
					if !math.IsInf(l.v, 1) && (l.v != math.Trunc(l.v) || l.v < 0) {
						return mcpResult{}, fmt.Errorf("%s must be a non-negative integer", l.name)
					}
				}
				root, err := b.flowJob(ctx, a.str("jobId"), true)
				if err != nil {
					return mcpResult{}, err
				}
				if root == nil || rawString(root.Get("queue")) != a.str("queueName") {
					return failText(errorText("Flow not found"))
				}
				left := mcpFlowMaxJobs // a tree read repeats ids at will (childrenIds is data)
				tree, err := b.flowNode(ctx, *root, depth, maxChildren, map[string]bool{}, nil, &left)
				if err != nil {
					return mcpResult{}, err
				}
				return prettyText(tree)
			}},
	}
}

// withDesc is s with a description of its own.
func withDesc(s *schema, desc string) *schema {
	c := *s
	c.desc = desc
	return &c
}

func checkFlat(steps []*flowStep) error {
	if len(steps) > mcpFlowMaxJobs {
		return fmt.Errorf("flow exceeds the %d job limit", mcpFlowMaxJobs)
	}
	for _, s := range steps {
		if err := s.check(0); err != nil {
			return err
		}
	}
	return nil
}

// planTree plans node and its children, children first, and answers the
// node as the tool shows it: {jobId, name, queueName, children}.
func planTree(node *flowStep, parent *plannedJob, depth int, jobs *[]*plannedJob) ([]byte, error) {
	if err := node.check(depth); err != nil {
		return nil, err
	}
	if len(*jobs) >= mcpFlowMaxJobs {
		return nil, fmt.Errorf("flow exceeds the %d job limit", mcpFlowMaxJobs)
	}
	j := node.job(newID())
	first := len(*jobs)
	var kids [][]byte
	for _, c := range node.Children {
		out, err := planTree(c, j, depth+1, jobs)
		if err != nil {
			return nil, err
		}
		kids = append(kids, out)
	}
	// The children were planned first, each after its own children.
	for _, c := range (*jobs)[first:] {
		if c.parentID == j.id {
			j.childrenIds = append(j.childrenIds, c.id)
		}
	}
	if parent != nil {
		j.parentID = parent.id
		j.extra = append(j.extra, flowExtra{"__parentId", parent.id}, flowExtra{"__parentQueue", parent.queue})
	}
	if len(j.childrenIds) > 0 {
		j.extra = append(j.extra, flowExtra{"__childrenIds", j.childrenIds})
		j.dependsOn = j.childrenIds
	}
	*jobs = append(*jobs, j)
	o := newJSONObj().str("jobId", j.id).str("name", j.name).str("queueName", j.queue)
	if len(kids) > 0 {
		o.json("children", jsonArr(kids))
	}
	return o.close(), nil
}

// flowJob reads a job of a flow; nil for a root that does not exist.
func (b *mcpBackend) flowJob(ctx context.Context, id string, root bool) (*Map, error) {
	m, err := b.call(ctx, "GetJob", "id", id)
	if err != nil {
		return nil, err
	}
	if err := refusal(m, "Unable to fetch flow job "+id); err != nil {
		if root && err.Error() == "Job not found" {
			return nil, nil
		}
		return nil, err
	}
	if nullish(m.Get("job")) {
		if root {
			return nil, nil
		}
		return nil, fmt.Errorf("GetJob returned no snapshot for flow job %s", id)
	}
	j, err := ParseMap(m.Get("job"), nil)
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// parentRef is the parent a flow's child must point back to.
type parentRef struct{ id, queue string }

// flowNode renders a job and its children down to depth; left counts the
// nodes the whole read may still render.
func (b *mcpBackend) flowNode(ctx context.Context, job Map, depth, maxChildren float64, ancestors map[string]bool, parent *parentRef, left *int) ([]byte, error) {
	if *left--; *left < 0 {
		return nil, fmt.Errorf("flow exceeds the %d job limit", mcpFlowMaxJobs)
	}
	id := rawString(job.Get("id"))
	queue := rawString(job.Get("queue"))
	if ancestors[id] {
		return nil, fmt.Errorf("Flow topology contains a cycle at job %s", id)
	}
	data, _ := ParseMap(job.Get("data"), nil)
	if parent != nil {
		pid, _ := data.Get("__parentId").Str()
		pq, _ := data.Get("__parentQueue").Str()
		if rawString(job.Get("parentId")) != parent.id || pid != parent.id || pq != parent.queue {
			return nil, fmt.Errorf("Flow child %s does not point back to parent %s", id, parent.id)
		}
	}
	name := "default"
	if n := job.Get("name"); !absent(n) {
		s, err := n.Str()
		if err != nil || s == "" {
			return nil, errors.New("Job name must be a non-empty string of at most 256 characters")
		}
		name = s
	}
	o := newJSONObj().str("jobId", id).str("name", name).str("queueName", queue)
	raw := job.Get("childrenIds")
	if nullish(raw) {
		raw = data.Get("__childrenIds")
	}
	var childIDs []string
	if !nullish(raw) {
		items, err := raw.Array()
		if err != nil {
			return nil, fmt.Errorf("Flow job %s has invalid childrenIds", id)
		}
		for _, it := range items {
			s, err := it.Str()
			if err != nil {
				return nil, fmt.Errorf("Flow job %s has invalid childrenIds", id)
			}
			childIDs = append(childIDs, s)
		}
	}
	if depth <= 0 || len(childIDs) == 0 || maxChildren == 0 {
		return o.close(), nil
	}
	if !math.IsInf(maxChildren, 1) && int(maxChildren) < len(childIDs) {
		childIDs = childIDs[:int(maxChildren)]
	}
	next := make(map[string]bool, len(ancestors)+1)
	for k := range ancestors {
		next[k] = true
	}
	next[id] = true
	var kids [][]byte
	for _, cid := range childIDs {
		child, err := b.flowJob(ctx, cid, false)
		if err != nil {
			return nil, err
		}
		out, err := b.flowNode(ctx, *child, depth-1, maxChildren, next, &parentRef{id: id, queue: queue}, left)
		if err != nil {
			return nil, err
		}
		kids = append(kids, out)
	}
	if len(kids) > 0 {
		o.json("children", jsonArr(kids))
	}
	return o.close(), nil
}
