package main

// Client-side subcommands of the binary: the operator's commands, spoken
// over the wire protocol (see clicmds.go for what each sends), and the
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

// cliMain runs a client subcommand. args start with the command word or
// with global options; a line with no command word left is the server's.
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
	if o.help {
		return printHelp(cmd, stdout, stderr)
	}
	switch cmd {
	case "version":
		return cliVersion(o, stdout)
	case "doctor":
		return cliDoctor(o, stdout, stderr)
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
func (o cliOpts) httpBase() string {
	scheme := "http"
	if o.tls || o.tlsCA != "" || o.tlsNoVerify {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(o.host, strconv.Itoa(o.port+1))
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

// cliVersion prints this binary's version and the server's, when one is
// reachable over HTTP.
func cliVersion(o cliOpts, stdout io.Writer) int {
	doc, err := fetchHealth(o, 3*time.Second)
	server := map[string]any{"endpoint": o.httpBase(), "reachable": err == nil}
	// A queued names its own version apart from the bunqueue version it
	// answers to; the reference has only the latter.
	if err == nil && doc["queuedVersion"] != nil {
		doc["version"] = doc["queuedVersion"]
	}
	if err == nil && doc["version"] != nil {
		server["version"] = doc["version"]
	}
	if o.json {
		b, _ := json.MarshalIndent(map[string]any{"ok": true, "client": map[string]any{"name": "queued", "version": version},
			"server": server}, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	fmt.Fprintln(stdout, "Client:", versionLine())
	if err != nil {
		fmt.Fprintf(stdout, "Server: not reachable at %s (%v)\n", o.httpBase(), err)
	} else {
		fmt.Fprintf(stdout, "Server: %s at %s\n", jsStr(doc["version"], "unknown version"), o.httpBase())
	}
	return 0
}

// cmdBackup fetches a consistent copy of a running server's database over
// HTTP and writes it to a file, refusing to overwrite one.
func cmdBackupCLI(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("queued backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "file to write the backup to (must not exist)")
	toS3 := fs.Bool("s3", false, "have the server upload a backup to its S3 bucket (POST /backup/s3) instead")
	url := new(string)
	*url = envOr([]string{"QUEUED_HTTP_URL"}, "http://127.0.0.1:6790")
	fs.Var(dsnFlag{url}, "url", "the server's HTTP `address` [QUEUED_HTTP_URL]")
	tokenEnv := []string{"QUEUED_TOKEN", "BQ_TOKEN", "BUNQUEUE_TOKEN"}
	token := new(string)
	*token = envOr(tokenEnv, "")
	fs.Var(hiddenFlag{token}, "token", "auth `token`, when the server has AUTH_TOKENS [QUEUED_TOKEN]"+fromEnvNote(tokenEnv))
	caFile := fs.String("tls-ca", "", "verify an https:// server with this CA certificate")
	noVerify := fs.Bool("tls-no-verify", false, "do not verify an https:// server's certificate (testing only)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: queued backup --out FILE [--url http://host:6790] [--token T] [--tls-ca FILE]\n       queued backup --s3 [--url http://host:6790] [--token T] [--tls-ca FILE]\n\nCopies a running server's SQLite database, consistently, to FILE, or has the server upload one to its S3 bucket.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *toS3 {
		return backupS3Remote(*url, *token, stdout, stderr)
	}
	if *out == "" {
		fmt.Fprintln(stderr, "queued backup: --out FILE is required")
		return 2
	}
	tcfg, err := clientTLS(false, *caFile, *noVerify)
	if err != nil {
		fmt.Fprintln(stderr, "queued backup:", err)
		return 2
	}
	if err := backupTo(*url, *token, *out, tcfg); err != nil {
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
