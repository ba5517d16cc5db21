package main

// Client-side subcommands of the binary.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// cmdBackup fetches a consistent copy of a running server's database over
// HTTP and writes it to a file, refusing to overwrite one.
func cmdBackupCLI(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("queued backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "file to write the backup to (must not exist)")
	toS3 := fs.Bool("s3", false, "have the server upload a backup to its S3 bucket (POST /backup/s3) instead")
	url := fs.String("url", envOr([]string{"QUEUED_HTTP_URL"}, "http://127.0.0.1:6790"), "the server's HTTP address [QUEUED_HTTP_URL]")
	token := fs.String("token", envOr([]string{"QUEUED_TOKEN", "BQ_TOKEN", "BUNQUEUE_TOKEN"}, ""), "auth token, when the server has AUTH_TOKENS [QUEUED_TOKEN]")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: queued backup --out FILE [--url http://host:6790] [--token T]\n       queued backup --s3 [--url http://host:6790] [--token T]\n\nCopies a running server's SQLite database, consistently, to FILE, or has the server upload one to its S3 bucket.")
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
	if err := backupTo(*url, *token, *out); err != nil {
		fmt.Fprintln(stderr, "queued backup:", err)
		return 1
	}
	fi, _ := os.Stat(*out)
	fmt.Fprintf(stdout, "backup written to %s (%d bytes)\n", *out, fi.Size())
	return 0
}

func backupTo(base, token, out string) error {
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
	resp, err := (&http.Client{Timeout: 10 * time.Minute}).Do(req)
	if err != nil {
		return fmt.Errorf("asking %s for a backup: %w", base, err)
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
