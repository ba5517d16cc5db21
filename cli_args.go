package main

// Argument parsing for the client subcommands. The global options may stand
// anywhere on the line, as they do for the reference CLI; each subcommand
// then parses its own options and positionals.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// usageError is bad input on the command line: it exits 2, before any
// connection is made.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{msg: fmt.Sprintf(format, a...)} }

// cliOpts are the options every client subcommand shares.
type cliOpts struct {
	host        string
	port        int
	token       string
	tls         bool
	tlsCA       string
	tlsNoVerify bool
	json        bool
	help        bool
	version     bool
	hostSet     bool
	portSet     bool
	// wordAt is where in the line the first word that is not a global
	// option stands (the command word), -1 when there is none.
	wordAt int
}

// parseGlobal takes the global options out of args wherever they stand and
// returns the rest in order. After `pull` and `job wait`, -t is their
// --timeout, so it stays with them.
func parseGlobal(args []string) (cliOpts, []string, error) {
	o := globalDefaults()
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			if len(rest) == 0 {
				o.wordAt = i
			}
			rest = append(rest, args[i:]...)
			return o, rest, nil
		}
		if a == "-t" && ownsShortT(rest) {
			rest = append(rest, a)
			continue
		}
		took, ok, err := o.globalOption(args, i, len(rest) == 0)
		if err != nil {
			return o, nil, err
		}
		if !ok {
			if len(rest) == 0 {
				o.wordAt = i
			}
			rest = append(rest, a)
		}
		i += took
	}
	return o, rest, nil
}

// globalDefaults are the global options before the line is read: the
// environment's, or the defaults.
func globalDefaults() cliOpts {
	o := cliOpts{
		host:   envOr([]string{"HOST", "BUNQUEUE_HOST", "BQ_HOST"}, "localhost"),
		port:   6789,
		token:  envOr([]string{"BQ_TOKEN", "BUNQUEUE_TOKEN"}, ""),
		wordAt: -1,
	}
	if p := envOr([]string{"TCP_PORT", "BUNQUEUE_TCP_PORT", "BQ_TCP_PORT"}, ""); p != "" {
		if n, err := strconv.Atoi(p); err == nil && n >= 1 && n <= 65535 {
			o.port = n
		}
	}
	return o
}

// globalOption reads args[i] into o when it is a global option (ok), and
// answers how many words after it were its value (took). -h and -v are
// help and version only before the command word (first).
func (o *cliOpts) globalOption(args []string, i int, first bool) (took int, ok bool, err error) {
	a := args[i]
	value := func() (string, error) {
		if i+1 >= len(args) || (strings.HasPrefix(args[i+1], "-") && args[i+1] != "-") {
			return "", usagef("%s needs a value", a)
		}
		return args[i+1], nil
	}
	switch {
	case a == "--host" || a == "-H":
		v, err := value()
		if err != nil {
			return 0, true, err
		}
		o.host, o.hostSet = v, true
		return 1, true, nil
	case strings.HasPrefix(a, "--host="):
		o.host, o.hostSet = a[len("--host="):], true
	case a == "--port" || a == "-p":
		v, err := value()
		if err != nil {
			return 0, true, err
		}
		return 1, true, o.setPort(v)
	case strings.HasPrefix(a, "--port="):
		return 0, true, o.setPort(a[len("--port="):])
	case a == "--token" || a == "-t":
		v, err := value()
		if err != nil {
			return 0, true, err
		}
		o.token = v
		return 1, true, nil
	case strings.HasPrefix(a, "--token="):
		o.token = a[len("--token="):]
	case a == "--tls":
		o.tls = true
	case a == "--tls-no-verify":
		o.tlsNoVerify = true
	case a == "--tls-ca":
		v, err := value()
		if err != nil {
			return 0, true, err
		}
		o.tlsCA = v
		return 1, true, nil
	case strings.HasPrefix(a, "--tls-ca="):
		o.tlsCA = a[len("--tls-ca="):]
	case a == "--json":
		o.json = true
	case a == "--help" || (a == "-h" && first):
		o.help = true
	case a == "--version" || (a == "-v" && first):
		o.version = true
	default:
		return 0, false, nil
	}
	return 0, true, nil
}

func (o *cliOpts) setPort(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return usagef("invalid port %q: want a number from 1 to 65535", s)
	}
	o.port, o.portSet = n, true
	return nil
}

func ownsShortT(rest []string) bool {
	return (len(rest) >= 1 && rest[0] == "pull") || (len(rest) >= 2 && rest[0] == "job" && rest[1] == "wait")
}

// optSpec declares one option of a subcommand.
type optSpec struct {
	long  string
	short string // one letter, or ""
	bool  bool   // a switch, takes no value
}

// parsedArgs are a subcommand's options and positionals.
type parsedArgs struct {
	vals map[string]string
	set  map[string]bool
	pos  []string
}

func (p parsedArgs) str(name string) string { return p.vals[name] }

// negNumber matches a negative number given as a positional (a priority, or
// JSON data such as -5), which must not be read as an option.
var negNumber = regexp.MustCompile(`^-\d+(\.\d+)?([eE][-+]?\d+)?$`)

// parseArgs reads options and positionals. An option the subcommand does
// not have is an error rather than silently ignored: a typo in a flag
// should not push a job with defaults.
func parseArgs(cmd string, args []string, specs ...optSpec) (parsedArgs, error) {
	p := parsedArgs{vals: map[string]string{}, set: map[string]bool{}}
	find := func(name string, short bool) *optSpec {
		for i := range specs {
			if (!short && specs[i].long == name) || (short && specs[i].short != "" && specs[i].short == name) {
				return &specs[i]
			}
		}
		return nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			p.pos = append(p.pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" || negNumber.MatchString(a) {
			p.pos = append(p.pos, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		short := !strings.HasPrefix(a, "--")
		if short && len(name) > 1 && !hasVal {
			// -P5: a short option with its value attached.
			name, val, hasVal = name[:1], name[1:], true
		}
		s := find(name, short)
		if s == nil {
			return p, usagef("%s: unknown option %s (see queued %s --help)", cmd, a, strings.Fields(cmd)[0])
		}
		if s.bool {
			if hasVal {
				return p, usagef("%s: --%s takes no value", cmd, s.long)
			}
			p.set[s.long] = true
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return p, usagef("%s: --%s needs a value", cmd, s.long)
			}
			i++
			val = args[i]
		}
		p.vals[s.long] = val
		p.set[s.long] = true
	}
	return p, nil
}

// need returns positional i or a usage error naming it.
func (p parsedArgs) need(cmd string, i int, name string) (string, error) {
	if i >= len(p.pos) || strings.TrimSpace(p.pos[i]) == "" {
		return "", usagef("%s: missing required argument: %s", cmd, name)
	}
	return p.pos[i], nil
}

// parseInt reads a whole number as the reference does: digits only, within
// JavaScript's safe integer range.
func parseInt(cmd, name, s string) (int64, error) {
	t := strings.TrimPrefix(s, "-")
	if t == "" || strings.TrimLeft(t, "0123456789") != "" {
		return 0, usagef("%s: invalid number for %s: %q", cmd, name, s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > 1<<53-1 || n < -(1<<53-1) {
		return 0, usagef("%s: invalid number for %s: %q", cmd, name, s)
	}
	return n, nil
}

// optInt reads an optional numeric option.
func (p parsedArgs) optInt(cmd, name string) (int64, bool, error) {
	v, ok := p.vals[name]
	if !ok {
		return 0, false, nil
	}
	n, err := parseInt(cmd, name, v)
	return n, err == nil, err
}

// parseJSON reads a JSON argument into the values the encoder takes: whole
// numbers stay integers (so that 5 goes out as 5, not 5.0), others float64.
func parseJSON(cmd, name, s string) (any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, usagef("%s: invalid JSON for %s: %s", cmd, name, s)
	}
	if d.More() {
		return nil, usagef("%s: invalid JSON for %s: %s (trailing text)", cmd, name, s)
	}
	return fromJSON(v), nil
}

func fromJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, err := x.Int64(); err == nil && n <= 1<<53-1 && n >= -(1<<53-1) {
			return n
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, it := range x {
			x[k] = fromJSON(it)
		}
		return x
	case []any:
		for i, it := range x {
			x[i] = fromJSON(it)
		}
		return x
	}
	return v
}

// toJSON turns a decoded answer into values encoding/json can write the way
// JSON.stringify would: undefined fields vanish, NaN becomes null.
func toJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, it := range x {
			if _, undef := it.(Undefined); undef {
				continue
			}
			out[k] = toJSON(it)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = toJSON(it)
		}
		return out
	case Undefined:
		return nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil
		}
	case Ext:
		return map[string]any{"extType": x.Type, "data": x.Data}
	}
	return v
}

// splitList splits a comma-separated option, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, it := range strings.Split(s, ",") {
		if it = strings.TrimSpace(it); it != "" {
			out = append(out, it)
		}
	}
	return out
}

// isTerminal reports whether w is a character device (a terminal), where
// colours and a live progress line make sense.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

var errNoJob = errors.New("Job not found")
