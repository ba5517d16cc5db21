package main

// The systemd side: READY=1 once the listeners are up and STOPPING=1 on
// SIGTERM, written by hand to NOTIFY_SOCKET; and logs without their own
// timestamps when stderr is the journal.

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// listenNotify opens a datagram socket standing in for systemd's.
func listenNotify(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	uc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	return uc
}

func readNotify(t *testing.T, uc *net.UnixConn, within time.Duration) string {
	t.Helper()
	buf := make([]byte, 4096)
	uc.SetReadDeadline(time.Now().Add(within))
	n, err := uc.Read(buf)
	if err != nil {
		t.Fatalf("no notification within %v: %v", within, err)
	}
	return string(buf[:n])
}

func TestNotifyReadyAndStopping(t *testing.T) {
	t.Parallel()
	bin := queuedBinary(t)
	sock := filepath.Join(t.TempDir(), "notify.sock")
	uc := listenNotify(t, sock)
	tcp, httpPort := freePort(t), freePort(t)
	cmd := exec.Command(bin, "serve", "--memory", "--host", "127.0.0.1", "--tcp-port", fmt.Sprint(tcp),
		"--http-port", fmt.Sprint(httpPort))
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	msg := readNotify(t, uc, 30*time.Second)
	if !strings.HasPrefix(msg, "READY=1\n") && msg != "READY=1" {
		t.Fatalf("first notification: %q", msg)
	}
	// Ready means both listeners accept now, not eventually.
	for _, p := range []int{tcp, httpPort} {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), time.Second)
		if err != nil {
			t.Fatalf("READY=1 was sent, but port %d does not accept: %v", p, err)
		}
		c.Close()
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if msg := readNotify(t, uc, 10*time.Second); msg != "STOPPING=1" {
		t.Fatalf("notification after SIGTERM: %q", msg)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", waitErr, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("did not exit within 15s of SIGTERM")
	}
	if !strings.Contains(logs.String(), "stopped") {
		t.Errorf("logs: %s", logs.String())
	}
}

// An @ name is a socket in the abstract namespace, as systemd may give.
//
// Serial: it sets environment variables (t.Setenv).
func TestNotifyAbstractSocket(t *testing.T) {
	name := fmt.Sprintf("queued-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	uc := listenNotify(t, "@"+name)
	t.Setenv("NOTIFY_SOCKET", "@"+name)
	if err := sdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
	if msg := readNotify(t, uc, 5*time.Second); msg != "READY=1" {
		t.Errorf("got %q", msg)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Errorf("without NOTIFY_SOCKET: %v", err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent.sock"))
	if err := sdNotify("READY=1"); err == nil || !strings.Contains(err.Error(), "absent.sock") {
		t.Errorf("to a missing socket: want an error naming it, got %v", err)
	}
}

// Serial: it sets environment variables (t.Setenv).
func TestJournalLogsWithoutTime(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	logLine := func() string {
		t.Helper()
		f.Truncate(0)
		f.Seek(0, 0)
		log, err := newLogger(f, "info", "text")
		if err != nil {
			t.Fatal(err)
		}
		log.Info("hello", "k", "v")
		b, _ := os.ReadFile(f.Name())
		line, _ := bufio.NewReader(bytes.NewReader(b)).ReadString('\n')
		return line
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	if line := logLine(); strings.Contains(line, "time=") || !strings.Contains(line, "level=INFO msg=hello k=v") {
		t.Errorf("under the journal: %q", line)
	}
	// JOURNAL_STREAM naming another stream (stderr redirected by the
	// service itself): the time stays.
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1))
	if line := logLine(); !strings.HasPrefix(line, "time=") {
		t.Errorf("stderr not the journal: %q", line)
	}
}
