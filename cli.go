package main

// Client-side subcommands of the binary: the dispatch of every command
// line, and the operator's commands, spoken over the wire protocol (see
// cli_cmds.go for what each sends). The other tools have files of their
// own: cli_bench.go, cli_backup.go, cli_migrate.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// toolCommands are the commands other than the client commands of
// clientCommands (cli_cmds.go). Each is given the rest of its line, with
// the global options that stood before its word: those that talk to a
// server read them, the others refuse them as unknown flags.
var toolCommands = map[string]func(args []string, stdout, stderr io.Writer) int{
	"serve":       func(a []string, o, e io.Writer) int { return serve(serverArgs(a), o, e) },
	"start":       func(a []string, o, e io.Writer) int { return serve(serverArgs(a), o, e) },
	"help":        runHelp,
	"version":     runVersion,
	"doctor":      runDoctor,
	"bench":       runBench,
	"backup":      runBackup,
	"backups":     runBackups,
	"restore":     runRestore,
	"migrate":     runMigrate,
	"healthcheck": runHealthcheck,
	"mcp":         runMCP,
}

// cliMain runs a command whose line starts with global options (a line
// that starts with the command word is dispatched by run). A line with no
// command word left is the server's.
func cliMain(args []string, stdout, stderr io.Writer) int {
	o, rest, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
		switch {
		case o.help:
			fmt.Fprint(stdout, mainHelp())
			return 0
		case o.version:
			fmt.Fprintln(stdout, versionLine())
			return 0
		}
		return serve(serverArgs(args), stdout, stderr)
	}
	cmd, cargs := rest[0], rest[1:]
	if f, ok := toolCommands[cmd]; ok {
		// The global options are documented as allowed anywhere, before
		// the command word too: the tool gets the line without its word.
		line := append(append([]string{}, args[:o.wordAt]...), args[o.wordAt+1:]...)
		return f(line, stdout, stderr)
	}
	if o.help {
		return printHelp(cmd, stdout, stderr)
	}
	if !isClientCommand(cmd) {
		fmt.Fprintf(stderr, "queued: unknown command %q (try: queued help)\n", cmd)
		return 2
	}
	req, sub, err := buildRequest(cmd, cargs)
	if err != nil {
		return cliFail(o, stderr, err, 2)
	}
	return runClientCommand(o, cmd, sub, req, stdout, stderr)
}

// runHelp is `queued help [COMMAND]`; global options may stand around it.
func runHelp(args []string, stdout, stderr io.Writer) int {
	_, rest, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	if len(rest) == 0 {
		fmt.Fprint(stdout, mainHelp())
		return 0
	}
	return printHelp(rest[0], stdout, stderr)
}

// serverCheck reads the global options of version and doctor, which take
// no argument of their own.
func serverCheck(name string, args []string, stdout, stderr io.Writer, do func(cliOpts) int) int {
	o, rest, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintln(stderr, "queued:", err)
		return 2
	}
	if o.help {
		return printHelp(name, stdout, stderr)
	}
	if len(rest) > 0 {
		return cliFail(o, stderr, usagef("%s: unexpected argument %q (see queued help %s)", name, rest[0], name), 2)
	}
	return do(o)
}

// runVersion is `queued version`: this binary's version and the server's.
func runVersion(args []string, stdout, stderr io.Writer) int {
	return serverCheck("version", args, stdout, stderr, func(o cliOpts) int { return cliVersion(o, stdout) })
}

// runDoctor is `queued doctor`: checks of a running server.
func runDoctor(args []string, stdout, stderr io.Writer) int {
	return serverCheck("doctor", args, stdout, stderr, func(o cliOpts) int { return cliDoctor(o, stdout, stderr) })
}

// serverArgs lets the server be started with the client's spelling of its
// address (-H, -p), as the reference allows.
func serverArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		switch {
		case a == "-p" || a == "--port":
			a = "--tcp-port"
		case strings.HasPrefix(a, "--port="):
			a = "--tcp-port=" + a[len("--port="):]
		case a == "-H":
			a = "--host"
		}
		out = append(out, a)
	}
	return out
}

// cliFail reports an error the way the output mode wants and returns code.
func cliFail(o cliOpts, stderr io.Writer, err error, code int) int {
	if o.json {
		b, _ := json.Marshal(map[string]any{"ok": false, "error": err.Error()})
		fmt.Fprintln(stderr, string(b))
	} else {
		fmt.Fprintln(stderr, "Error:", err)
	}
	return code
}

func (o cliOpts) addr() string { return net.JoinHostPort(o.host, strconv.Itoa(o.port)) }

func (o cliOpts) clientConfig() (ClientConfig, error) {
	t, err := clientTLS(o.tls, o.tlsCA, o.tlsNoVerify)
	if err != nil {
		return ClientConfig{}, err
	}
	return ClientConfig{Addr: o.addr(), Token: o.token, TLS: t}, nil
}

// callTimeoutFor bounds a command's round trip: 30 s, and for the commands
// that wait on the server (PULL, WaitJob) their own wait plus 10 s, so
// that the client never gives up before the server answers.
func callTimeoutFor(req map[string]any) time.Duration {
	d := 30 * time.Second
	if c := req["cmd"]; c == "PULL" || c == "WaitJob" {
		if t, ok := req["timeout"].(int64); ok {
			d = max(d, time.Duration(t)*time.Millisecond+10*time.Second)
		} else {
			d = 40 * time.Second
		}
	}
	return d
}

// runClientCommand connects, sends req and prints the answer.
func runClientCommand(o cliOpts, cmd, sub string, req map[string]any, stdout, stderr io.Writer) int {
	cfg, err := o.clientConfig()
	if err != nil {
		return cliFail(o, stderr, err, 2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeoutFor(req)+cfg.DialTimeout+defaultDialTimeout)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		return cliFail(o, stderr, err, 1)
	}
	defer c.Close()
	cctx, ccancel := context.WithTimeout(ctx, callTimeoutFor(req))
	defer ccancel()
	start := time.Now()
	ans, err := c.Call(cctx, req)
	rtt := time.Since(start)
	if err != nil {
		var se *ServerError
		if errors.As(err, &se) && req["cmd"] == "Prometheus" && se.Msg == "Unknown command: Prometheus" {
			// queued has no Prometheus text yet; its Metrics carries the
			// same counters.
			req = map[string]any{"cmd": "Metrics"}
			ans, err = c.Call(cctx, req)
		}
	}
	if err != nil {
		var se *ServerError
		if errors.As(err, &se) {
			return cliFail(o, stderr, fmt.Errorf("%s failed: %s", se.Cmd, se.Msg), 1)
		}
		return cliFail(o, stderr, err, 1)
	}
	v := &view{o: o, cmd: cmd, sub: sub, req: req, ans: unwrapData(ans), rtt: rtt, now: time.Now()}
	if err := v.check(); err != nil {
		return cliFail(o, stderr, err, 1)
	}
	if req["cmd"] == "FAIL" && v.ans["applied"] != false && !o.json {
		// FAIL's answer does not say whether the job will run again:
		// its state does.
		v.after, v.afterErr = c.Call(cctx, map[string]any{"cmd": "GetJob", "id": req["id"]})
		if v.afterErr == nil {
			v.after = unwrapData(v.after)
		}
		v.now = time.Now()
	}
	if o.json {
		out := toJSON(ans).(map[string]any)
		delete(out, "reqId")
		var doc any = out
		if cmd == "push" {
			doc = map[string]any{"id": ans["id"]}
		}
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return cliFail(o, stderr, fmt.Errorf("writing the answer as JSON: %w", err), 1)
		}
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	v.render(stdout)
	if req["cmd"] == "RegisterWorker" {
		fmt.Fprintln(stderr, "Warning: a worker registered here lasts only as long as this command's connection; "+
			"run a long-lived worker with a client library instead.")
	}
	return 0
}

// unwrapData lifts the fields of an answer's data map to the top, since
// which results are wrapped is historical and per command.
func unwrapData(ans map[string]any) map[string]any {
	d, ok := ans["data"].(map[string]any)
	if !ok {
		return ans
	}
	out := make(map[string]any, len(ans)+len(d))
	for k, v := range ans {
		out[k] = v
	}
	for k, v := range d {
		out[k] = v
	}
	return out
}

// httpBase is the server's HTTP address as the reference CLI finds it: the
// same host, the TCP port plus one, HTTPS when TLS is on.
func (o cliOpts) httpBase() string { return o.httpBaseAt(o.port + 1) }

// httpBaseAt is the server's HTTP address on the given port.
func (o cliOpts) httpBaseAt(port int) string {
	scheme := "http"
	if o.tls || o.tlsCA != "" || o.tlsNoVerify {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(o.host, strconv.Itoa(port))
}

// fetchHealth reads the server's /health document.
func fetchHealth(o cliOpts, timeout time.Duration) (map[string]any, error) {
	t, err := clientTLS(o.tls, o.tlsCA, o.tlsNoVerify)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: t}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, o.httpBase()+"/health", nil)
	if err != nil {
		return nil, err
	}
	if o.token != "" {
		// A server with tokens shows its details to their holders only.
		req.Header.Set("Authorization", "Bearer "+o.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("HTTP %s from %s/health, not a health document", resp.Status, o.httpBase())
	}
	if resp.StatusCode != http.StatusOK && doc["status"] == nil {
		return nil, fmt.Errorf("HTTP %s from %s/health", resp.Status, o.httpBase())
	}
	return doc, nil
}

func versionLine() string {
	return fmt.Sprintf("queued %s (bunqueue protocol %d, compatible with bunqueue %s)", version, protocolVersion, compatVersion)
}

// serverIdentity names the software and version behind a /health
// document: queued gives its own version (queuedVersion) beside the
// bunqueue version it is compatible with (version, which the official
// CLI's doctor compares with its own); the reference gives only the
// latter. Empty when the document shows neither (a server with tokens,
// asked without one).
func serverIdentity(doc map[string]any) (name, ver string) {
	if v := jsStr(doc["queuedVersion"], ""); v != "" {
		return "queued", v
	}
	if v := jsStr(doc["version"], ""); v != "" {
		return "bunqueue", v
	}
	return "", ""
}

// cliVersion prints this binary's version and the server's, when one is
// reachable over HTTP.
func cliVersion(o cliOpts, stdout io.Writer) int {
	doc, err := fetchHealth(o, 3*time.Second)
	server := map[string]any{"endpoint": o.httpBase(), "reachable": err == nil}
	name, ver := "", ""
	if err == nil {
		name, ver = serverIdentity(doc)
	}
	if ver != "" {
		server["name"], server["version"] = name, ver
		if name == "queued" && doc["version"] != nil {
			server["compatibleWith"] = "bunqueue " + jsStr(doc["version"], "")
		}
	}
	if o.json {
		b, _ := json.MarshalIndent(map[string]any{"ok": true, "client": map[string]any{"name": "queued", "version": version,
			"protocolVersion": protocolVersion, "compatibleWith": "bunqueue " + compatVersion}, "server": server}, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	fmt.Fprintln(stdout, "Client:", versionLine())
	switch {
	case err != nil:
		fmt.Fprintf(stdout, "Server: not reachable at %s (%v)\n", o.httpBase(), err)
	case ver == "":
		fmt.Fprintf(stdout, "Server: at %s; it shows its version only with its token (--token, BQ_TOKEN)\n", o.httpBase())
	default:
		fmt.Fprintf(stdout, "Server: %s %s at %s\n", name, ver, o.httpBase())
	}
	return 0
}
