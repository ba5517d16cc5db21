package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// docker runs the docker command line and answers its output.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestContainerImage builds the image (container/build), starts it in
// SQLite mode on a named volume, and checks that it answers /health and
// the wire protocol, that its HEALTHCHECK reports it healthy, and that a
// job pushed survives docker restart.
func TestContainerImage(t *testing.T) {
	t.Parallel()
	if err := exec.Command("docker", "info").Run(); err != nil {
		needService(t, "no Docker daemon", "apt-get install -y docker.io && dockerd &")
	}
	var b [4]byte
	rand.Read(b[:])
	name := "queued-test-" + hex.EncodeToString(b[:])
	tag := name + ":test"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The release binary the other tests run, built once: container/build's
	// own build (-trimpath) would compile every package again.
	build := exec.CommandContext(ctx, "container/build", tag)
	build.Env = append(os.Environ(), "QUEUED_BINARY="+buildRelease(t))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("container/build: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		exec.Command("docker", "rm", "-f", name).Run()
		exec.Command("docker", "volume", "rm", "-f", name).Run()
		exec.Command("docker", "rmi", "-f", tag).Run()
	})
	if user := docker(t, "image", "inspect", "--format", "{{.Config.User}}", tag); user != "65532:65532" {
		t.Fatalf("the image runs as %q, want a non-root user", user)
	}
	docker(t, "volume", "create", name)
	docker(t, "run", "-d", "--name", name, "-v", name+":/data", "-p", "127.0.0.1::6789", "-p", "127.0.0.1::6790", tag)
	port := func(p string) string {
		out := docker(t, "port", name, p)
		return out[strings.LastIndex(out, ":")+1:]
	}
	health := func() {
		url := "http://127.0.0.1:" + port("6790") + "/health"
		eventually(t, 60*time.Second, "the container's /health", func() (bool, string) {
			resp, err := http.Get(url)
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == 200, resp.Status
		})
	}
	health()
	c := dial(t, "127.0.0.1:"+port("6789"))
	id := str(t, c.ok(map[string]any{"cmd": "PUSH", "queue": "boxed", "data": map[string]any{"kept": true}}), "id")
	c.close()
	eventually(t, 90*time.Second, "docker to report the container healthy", func() (bool, string) {
		st := docker(t, "inspect", "--format", "{{.State.Health.Status}}", name)
		return st == "healthy", st
	})

	start := time.Now()
	docker(t, "restart", "-t", "45", name)
	t.Logf("docker restart took %v", time.Since(start).Round(10*time.Millisecond))
	health()
	c = dial(t, "127.0.0.1:"+port("6789"))
	if st := state(t, c, id); st != "waiting" {
		t.Fatalf("after docker restart the job is %q", st)
	}
	if logs := docker(t, "logs", name); !strings.Contains(logs, "stopped") || !strings.Contains(logs, fmt.Sprintf("waiting=%d", 1)) {
		t.Fatalf("the logs do not show a clean stop and the job recovered:\n%s", logs)
	}
}
