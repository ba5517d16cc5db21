package main

// What running as a service needs: TLS with a certificate that can be
// replaced while the server runs, the systemd readiness protocol, and logs
// that suit the journal.

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// certReloader holds the server's certificate. Handshakes read it through
// GetCertificate, so a reload (SIGHUP) applies to the next connection while
// the connections already up keep the session they have.
type certReloader struct {
	certFile, keyFile string
	cert              atomic.Pointer[tls.Certificate]
}

func newCertReloader(certFile, keyFile string) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// reload reads the pair again; on failure the certificate in use stays.
func (r *certReloader) reload() error {
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("loading TLS certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert.Store(&c)
	return nil
}

func (r *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// serverTLSConfig is TLS 1.2 and later with Go's default cipher suites,
// which are the modern AEAD ones only.
func (r *certReloader) serverTLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.getCertificate}
}

// sdNotify sends a state line to systemd's notification socket, as
// sd_notify(3) does; without NOTIFY_SOCKET (not started by systemd with
// Type=notify) it does nothing.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	// A leading @ names a socket in the abstract namespace.
	if path[0] == '@' {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify socket %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify socket %s: %w", os.Getenv("NOTIFY_SOCKET"), err)
	}
	return nil
}

// toJournal reports whether w is the stream systemd connected to the
// journal: JOURNAL_STREAM names its device and inode, so a service whose
// stderr was redirected elsewhere is not mistaken for one.
func toJournal(w io.Writer) bool {
	js := os.Getenv("JOURNAL_STREAM")
	if js == "" {
		return false
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	devS, inoS, ok := strings.Cut(js, ":")
	if !ok {
		return false
	}
	dev, err1 := strconv.ParseUint(devS, 10, 64)
	ino, err2 := strconv.ParseUint(inoS, 10, 64)
	var st syscall.Stat_t
	if err1 != nil || err2 != nil || syscall.Fstat(int(f.Fd()), &st) != nil {
		return false
	}
	return uint64(st.Dev) == dev && uint64(st.Ino) == ino
}

// journalOptions drops the time= field: the journal stamps every line
// itself, and a second time only makes lines longer.
func journalOptions(o *slog.HandlerOptions) *slog.HandlerOptions {
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	return o
}
