package main

// `queued healthcheck [URL]`: the container probe, as the reference's
// `bunqueue healthcheck` is. It asks the server's HTTP /health (by default
// on 127.0.0.1 and HTTP_PORT, 6790) and exits 0 when the answer says
// healthy, 1 otherwise. It needs no shell and starts nothing, so that an
// image built FROM scratch can run it as its HEALTHCHECK; it prints no
// credentials and no part of the answer.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// healthcheckTimeout bounds the probe, as the reference's does.
const healthcheckTimeout = 5 * time.Second

func runHealthcheck(args []string, stdout, stderr io.Writer) int {
	if err := healthcheck(args); err != nil {
		fmt.Fprintln(stderr, "Health check failed")
		return 1
	}
	fmt.Fprintln(stdout, "healthy")
	return 0
}

func healthcheck(args []string) error {
	if len(args) > 1 {
		return errors.New("expected at most one health URL")
	}
	raw := "http://127.0.0.1:" + envOr([]string{"HTTP_PORT"}, "6790") + "/health"
	if len(args) == 1 {
		raw = args[0]
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return errors.New("expected an http or https URL")
	}
	client := &http.Client{Timeout: healthcheckTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errors.New("redirected") }}
	resp, err := client.Get(u.String())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || body.Status != "healthy" {
		return errors.New("unhealthy")
	}
	return nil
}
