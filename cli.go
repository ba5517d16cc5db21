package main

// Client-side subcommands of the binary: the operator's commands, spoken
// over the wire protocol (see cli_cmds.go for what each sends), and the
// HTTP backup.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// toolCommands are the commands other than the client commands of
// clientCommands (cli_cmds.go). Each is given the rest of its line, with
// the global options that stood before its word: those that talk to a
// server read them, the others refuse them as unknown flags.
var toolCommands = map[string]func(args []string, stdout, stderr io.Writer) int{
	"serve":   func(a []string, o, e io.Writer) int { return serve(serverArgs(a), o, e) },
	"start":   func(a []string, o, e io.Writer) int { return serve(serverArgs(a), o, e) },
	"help":    runHelp,
	"version": runVersion,
	"doctor":  runDoctor,
	"bench":   runBench,
	"backup":  runBackup,
	"backups": runBackups,
	"restore": runRestore,
	"migrate": runMigrate,
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

const backupUsage = `Usage: queued backup --out FILE [-H HOST] [-p PORT] [--token T] [--tls ...]
       queued backup --s3 [-H HOST] [-p PORT] [--token T] [--tls ...]

Copies a running server's SQLite database, consistently, to FILE (which must
not exist), over the server's HTTP port (GET /backup); or, with --s3, has the
server upload a backup to its own S3 bucket (POST /backup/s3).

Options:
  --out FILE           the file to write
  --s3                 ask for an S3 backup instead
  -H, --host HOST      server host (default localhost) [HOST, BUNQUEUE_HOST, BQ_HOST]
  -p, --port PORT      the server's TCP port, as for every command (default 6789)
                       [TCP_PORT]; its HTTP port is taken to be PORT+1 (6790)
  --http-port PORT     the server's HTTP port, when it is not PORT+1
  --url URL            the whole HTTP address instead, such as http://host:6790
                       (the older spelling, kept) [QUEUED_HTTP_URL]
  -t, --token TOKEN    auth token, when the server has AUTH_TOKENS
                       [BQ_TOKEN, BUNQUEUE_TOKEN, QUEUED_TOKEN]
  --tls                HTTPS, verifying the server with the system roots
  --tls-ca FILE        HTTPS, verifying the server with this CA certificate
  --tls-no-verify      HTTPS without verifying the server (testing only)
`

// runBackup fetches a consistent copy of a running server's database
// over HTTP and writes it to a file, refusing to overwrite one. It takes
// the server's address as every command does (-H, -p: the TCP port, HTTP
// being the next one, as version and doctor find it), so that one line of
// global options reaches the same server whatever the command.
func runBackup(args []string, stdout, stderr io.Writer) int {
	g, rest, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintln(stderr, "queued backup:", err)
		return 2
	}
	if g.help {
		fmt.Fprint(stdout, backupUsage)
		return 0
	}
	fs := flag.NewFlagSet("queued backup", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("out", "", "")
	toS3 := fs.Bool("s3", false, "")
	var url string
	fs.Var(dsnFlag{&url}, "url", "")
	httpPort := fs.Int("http-port", 0, "")
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, backupUsage)
			return 0
		}
		fmt.Fprintf(stderr, "queued backup: %v\nSee: queued help backup\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "queued backup: unexpected argument %q\nSee: queued help backup\n", fs.Arg(0))
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["http-port"] && (*httpPort < 1 || *httpPort > 65535) {
		fmt.Fprintf(stderr, "queued backup: invalid --http-port %d: want a number from 1 to 65535\n", *httpPort)
		return 2
	}
	base := g.httpBase()
	if set["http-port"] {
		base = g.httpBaseAt(*httpPort)
	}
	switch {
	case set["url"] && (g.hostSet || g.portSet || set["http-port"]):
		fmt.Fprintln(stderr, "queued backup: --url names the whole address: give it, or -H/-p/--http-port, not both")
		return 2
	case set["url"]:
	case g.hostSet || g.portSet || set["http-port"]:
		url = base
	default:
		url = envOr([]string{"QUEUED_HTTP_URL"}, base)
	}
	if g.token == "" {
		// What this command read before it took BQ_TOKEN as the others
		// do; still read, last.
		g.token = envOr([]string{"QUEUED_TOKEN"}, "")
	}
	tcfg, err := clientTLS(g.tls, g.tlsCA, g.tlsNoVerify)
	if err != nil {
		fmt.Fprintln(stderr, "queued backup:", err)
		return 2
	}
	if *toS3 {
		return backupS3Remote(url, g.token, tcfg, stdout, stderr)
	}
	if *out == "" {
		fmt.Fprintln(stderr, "queued backup: --out FILE is required (or --s3)\nSee: queued help backup")
		return 2
	}
	if err := backupTo(url, g.token, *out, tcfg); err != nil {
		fmt.Fprintln(stderr, "queued backup:", err)
		return 1
	}
	fi, _ := os.Stat(*out)
	fmt.Fprintf(stdout, "backup written to %s (%d bytes)\n", *out, fi.Size())
	return 0
}

func backupTo(base, token, out string, tcfg *tls.Config) error {
	if _, err := os.Stat(out); err == nil {
		return fmt.Errorf("%s exists; choose another file", out)
	}
	req, err := http.NewRequest("GET", strings.TrimSuffix(base, "/")+"/backup", nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{TLSClientConfig: tcfg, Proxy: http.ProxyFromEnvironment}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("asking %s for a backup: %w", redactURL(base), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("server answered %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".queued-backup-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, resp.Body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("receiving the backup: %w", err)
	}
	// A backup that is not a whole SQLite file is not kept.
	head := make([]byte, 16)
	if f, err := os.Open(tmp.Name()); err == nil {
		io.ReadFull(f, head)
		f.Close()
	}
	if string(head) != "SQLite format 3\x00" || (resp.ContentLength >= 0 && n != resp.ContentLength) {
		return fmt.Errorf("received %d bytes that are not a complete SQLite database", n)
	}
	return os.Rename(tmp.Name(), out)
}
