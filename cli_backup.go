package main

// The backup commands: `queued backup` (a running server's database over
// HTTP, or an S3 backup by the server), `queued backups list` and `queued
// restore` (from S3). What they call is in backup.go and backup_s3.go.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

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

const backupsUsage = "Usage: queued backups list [--s3-bucket B] [--s3-prefix P] [S3 flags]\n\n" +
	"Lists the backups in an S3 bucket, newest first, with the URL queued restore takes.\n\nFlags:\n"

const restoreUsage = "Usage: queued restore --from s3://bucket/key --data-path FILE [S3 flags]\n\n" +
	"Downloads a backup from S3 into a new database file, verifying its checksums;\n" +
	"start a server on it with queued --data-path FILE.\n\nFlags:\n"

// s3CommandFlags are the flags of queued backups and queued restore: the
// S3 settings, with usage as their help.
func s3CommandFlags(cmd, usage string, s *s3Settings, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("queued "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	addS3Flags(fs, s)
	return fs
}

// s3CommandLog is the S3 client's logger in a command: warnings and
// errors, on stderr.
func s3CommandLog(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runBackups is `queued backups list`: the backups in a bucket, newest
// first.
func runBackups(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "-help"):
		// Help without the subcommand word.
	case len(args) == 0 || args[0] != "list":
		fmt.Fprintln(stderr, "usage: queued backups list [--s3-bucket B] [--s3-prefix P] [S3 flags] (see queued help backups)")
		return 2
	default:
		args = args[1:]
	}
	var s s3Settings
	fs := s3CommandFlags("backups", backupsUsage, &s, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if s.bucket == "" {
		fmt.Fprintln(stderr, "queued backups list: --s3-bucket (S3_BUCKET) is required")
		return 2
	}
	if s.prefix != "" && !strings.HasSuffix(s.prefix, "/") {
		s.prefix += "/"
	}
	c, err := s.client(s3CommandLog(stderr))
	if err != nil {
		fmt.Fprintln(stderr, "queued backups list:", err)
		return 2
	}
	list, err := listBackups(context.Background(), c, s.prefix)
	if err != nil {
		fmt.Fprintln(stderr, "queued backups list:", err)
		return 1
	}
	if len(list) == 0 {
		fmt.Fprintf(stdout, "no backups in s3://%s/%s\n", s.bucket, s.prefix)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TAKEN (UTC)\tBYTES\tURL")
	for _, b := range list {
		fmt.Fprintf(tw, "%s\t%d\ts3://%s/%s\n", b.Taken.UTC().Format("2006-01-02 15:04:05"), b.Size, s.bucket, b.Key)
	}
	tw.Flush()
	return 0
}

// runRestore is `queued restore`: a backup from S3 into a new database
// file (restoreBackup).
func runRestore(args []string, stdout, stderr io.Writer) int {
	var s s3Settings
	var from, dataPath string
	fs := s3CommandFlags("restore", restoreUsage, &s, stderr)
	fs.StringVar(&from, "from", "", "the backup: s3://bucket/key, or s3://bucket/prefix/ for the newest under it")
	fs.StringVar(&dataPath, "data-path", "", "the database file to create (must not exist)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if from == "" || dataPath == "" {
		fmt.Fprintln(stderr, "usage: queued restore --from s3://bucket/key --data-path FILE [S3 flags]")
		return 2
	}
	bucket, key, err := parseS3URL(from)
	if err != nil {
		fmt.Fprintln(stderr, "queued restore:", err)
		return 2
	}
	s.bucket = bucket
	c, err := s.client(s3CommandLog(stderr))
	if err != nil {
		fmt.Fprintln(stderr, "queued restore:", err)
		return 2
	}
	rep, err := restoreBackup(context.Background(), c, key, dataPath)
	if err != nil {
		fmt.Fprintln(stderr, "queued restore:", err)
		return 1
	}
	fmt.Fprintf(stdout, "restored s3://%s/%s to %s (%d bytes downloaded, %d bytes of database, %d jobs, checksums verified)\nstart it with: queued --data-path %s\n",
		bucket, rep.Key, dataPath, rep.Bytes, rep.DBBytes, rep.Jobs, dataPath)
	return 0
}

// backupS3Remote asks a running server for an S3 backup (POST /backup/s3);
// the server uses its own bucket and credentials.
func backupS3Remote(base, token string, tcfg *tls.Config, stdout, stderr io.Writer) int {
	req, err := http.NewRequest(http.MethodPost, strings.TrimSuffix(base, "/")+"/backup/s3", nil)
	if err != nil {
		fmt.Fprintln(stderr, "queued backup:", err)
		return 2
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 2 * time.Hour, Transport: &http.Transport{TLSClientConfig: tcfg, Proxy: http.ProxyFromEnvironment}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "queued backup: asking %s for an S3 backup: %v\n", redactURL(base), err)
		return 1
	}
	defer resp.Body.Close()
	var out struct {
		OK     bool   `json:"ok"`
		Error  string `json:"error"`
		URL    string `json:"url"`
		Bytes  int64  `json:"bytes"`
		DB     int64  `json:"dbBytes"`
		SHA    string `json:"sha256"`
		TookMs int64  `json:"tookMs"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(body, &out); err != nil {
		// Not queued answering (an older version, or something else on
		// that port): show what it said.
		fmt.Fprintf(stderr, "queued backup: %s answered %s: %.200s\n", redactURL(base), resp.Status, strings.TrimSpace(string(body)))
		return 1
	}
	if !out.OK {
		fmt.Fprintf(stderr, "queued backup: server answered %s: %s\n", resp.Status, out.Error)
		return 1
	}
	fmt.Fprintf(stdout, "backup uploaded to %s (%d bytes, %d bytes of database, sha256 %s, %d ms)\n", out.URL, out.Bytes, out.DB, out.SHA, out.TookMs)
	return 0
}
