package main

// TLS: the server's handshake on both ports, the client's verification
// (against a CA the test makes, failing without it, skipped only when asked
// by name), and a certificate replaced on SIGHUP while an old connection
// keeps working.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	dir     string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "queued test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), dir: t.TempDir()}
	if err := os.WriteFile(ca.caFile(), ca.certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return ca
}

func (ca *testCA) caFile() string { return filepath.Join(ca.dir, "ca.pem") }

// issue writes a server certificate for localhost and 127.0.0.1 with the
// given serial to cert.pem and key.pem (replacing them) and returns the
// paths.
func (ca *testCA) issue(t *testing.T, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, "cert.pem"), filepath.Join(ca.dir, "key.pem")
	// Written to temporary names and renamed, so that a reload never
	// reads half a file.
	for _, f := range []struct {
		path string
		data []byte
	}{
		{certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
		{keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})},
	} {
		if err := os.WriteFile(f.path+".tmp", f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.path+".tmp", f.path); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// startTLSServer runs runServer in memory with TLS on both ports.
func startTLSServer(t *testing.T, certFile, keyFile string) (tcpAddr, httpAddr string) {
	t.Helper()
	c := &config{host: "127.0.0.1", tcpPort: 0, httpPort: 0, memory: true, tlsCert: certFile, tlsKey: keyFile}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan [2]string, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- runServer(ctx, c, log, func(tcp, h net.Addr) { ready <- [2]string{tcp.String(), h.String()} })
	}()
	select {
	case a := <-ready:
		tcpAddr, httpAddr = a[0], a[1]
	case err := <-done:
		cancel()
		t.Fatalf("runServer: %v", err)
	case <-time.After(callTimeout):
		cancel()
		t.Fatal("server did not become ready")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runServer: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("runServer did not return within 15s of cancel")
		}
	})
	return tcpAddr, httpAddr
}

func dialClient(t *testing.T, cfg ClientConfig) (*Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func ping(t *testing.T, c *Client) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err := c.Call(ctx, map[string]any{"cmd": "Ping"})
	return err
}

func TestTLSHandshakeAndVerification(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, 100)
	addr, httpAddr := startTLSServer(t, certFile, keyFile)

	// Verified against the test's CA.
	c, err := dialClient(t, ClientConfig{Addr: addr, TLS: &tls.Config{RootCAs: ca.pool()}})
	if err != nil {
		t.Fatalf("dial with the CA: %v", err)
	}
	if err := ping(t, c); err != nil {
		t.Fatalf("ping over TLS: %v", err)
	}
	st := c.nc.(*tls.Conn).ConnectionState()
	if st.Version < tls.VersionTLS12 {
		t.Errorf("negotiated TLS version %x, want 1.2 or later", st.Version)
	}

	// Without the CA the system roots do not know it: refused.
	if _, err := dialClient(t, ClientConfig{Addr: addr, TLS: &tls.Config{}}); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("dial without the CA: want a certificate error, got %v", err)
	}

	// Verification off, asked for by name.
	if c, err := dialClient(t, ClientConfig{Addr: addr, TLS: &tls.Config{InsecureSkipVerify: true}}); err != nil {
		t.Fatalf("dial without verification: %v", err)
	} else if err := ping(t, c); err != nil {
		t.Fatal(err)
	}

	// TLS 1.1 is refused.
	if _, err := dialClient(t, ClientConfig{Addr: addr, TLS: &tls.Config{RootCAs: ca.pool(), MaxVersion: tls.VersionTLS11}}); err == nil {
		t.Error("a TLS 1.1 client was accepted")
	}

	// A plain client gets an explanation, not a hang.
	if c, err := dialClient(t, ClientConfig{Addr: addr}); err == nil {
		err = ping(t, c)
		if err == nil || !strings.Contains(err.Error(), "TLS") {
			t.Errorf("plain client against a TLS server: want an error naming TLS, got %v", err)
		}
	}

	// HTTPS on the HTTP port.
	hc := &http.Client{Timeout: callTimeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + httpAddr + "/health")
	if err != nil {
		t.Fatalf("GET /health over HTTPS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"healthy"`)) {
		t.Errorf("HTTPS /health: %s %s", resp.Status, body)
	}
	// queued backup speaks HTTPS with the same options; this server keeps
	// its data in memory, so the answer that proves the handshake is the
	// refusal to back it up.
	out := filepath.Join(t.TempDir(), "b.db")
	if code, _, errOut := runCLI(t, "backup", "--out", out, "--url", "https://"+httpAddr, "--tls-ca", ca.caFile()); code != 1 ||
		!strings.Contains(errOut, "needs SQLite") {
		t.Errorf("backup over HTTPS with the CA: exit %d, %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "backup", "--out", out, "--url", "https://"+httpAddr); code != 1 ||
		!strings.Contains(errOut, "certificate") {
		t.Errorf("backup over HTTPS without the CA: exit %d, %s", code, errOut)
	}
	if _, err := (&http.Client{Timeout: callTimeout}).Get("http://" + httpAddr + "/health"); err == nil {
		// Go's server answers plain HTTP on a TLS port with a 400, which
		// is not the health document.
		t.Log("plain HTTP on the HTTPS port answered (with an error status)")
	}
}

// The command line's TLS options: verification by default, --tls-ca,
// --tls-no-verify.
func TestTLSCommandLine(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, 7)
	addr, _ := startTLSServer(t, certFile, keyFile)
	host, port, _ := net.SplitHostPort(addr)
	base := []string{"ping", "-H", host, "-p", port}
	for _, tc := range []struct {
		extra  []string
		code   int
		stderr string
	}{
		{[]string{"--tls-ca", ca.caFile()}, 0, ""},
		{[]string{"--tls", "--tls-ca=" + ca.caFile()}, 0, ""},
		{[]string{"--tls"}, 1, "certificate"},
		{[]string{"--tls-no-verify"}, 0, ""},
		{nil, 1, "TLS"},
		{[]string{"--tls-ca", filepath.Join(ca.dir, "missing.pem")}, 2, "CA file"},
		{[]string{"--tls-ca", certFile + "x"}, 2, "CA file"},
	} {
		code, out, errOut := runCLI(t, append(append([]string{}, base...), tc.extra...)...)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("queued %v: exit %d (want %d), stdout %q, stderr %q (want it to mention %q)",
				tc.extra, code, tc.code, out, errOut, tc.stderr)
		}
	}
	// The bench speaks TLS the same way.
	code, out, errOut := runCLI(t, "bench", "pushb", "-H", host, "-p", port, "--tls-ca", ca.caFile(),
		"--jobs", "2000", "--connections", "2", "--pipeline", "2")
	if code != 0 || !strings.Contains(out, "TLS") {
		t.Errorf("bench over TLS: exit %d\n%s\n%s", code, out, errOut)
	}
}

// SIGHUP rereads the certificate: a new connection gets the new one, while
// a connection made before keeps working. The server is a process of its
// own: a SIGHUP sent to the test process would reach every in-process
// server and bench of the tests running beside this one (a bench ends on
// SIGHUP, and one did, in CI).
func TestTLSReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	certFile, keyFile := ca.issue(t, 1001)
	srv := startBinary(t, "--memory", "--tls-cert", certFile, "--tls-key", keyFile)
	addr := srv.addr()
	cfg := ClientConfig{Addr: addr, TLS: &tls.Config{RootCAs: ca.pool()}}
	serial := func(c *Client) int64 {
		return c.nc.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	old, err := dialClient(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s := serial(old); s != 1001 {
		t.Fatalf("first certificate: serial %d", s)
	}

	ca.issue(t, 2002)
	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a new connection sees the reloaded certificate", func() (bool, string) {
		c, err := dialClient(t, cfg)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		s := serial(c)
		return s == 2002, "serial " + strconv.FormatInt(s, 10)
	})
	if err := ping(t, old); err != nil {
		t.Fatalf("the connection made before the reload stopped working: %v", err)
	}

	// A broken pair on reload keeps the certificate in use.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the failed reload logged", func() (bool, string) {
		return strings.Contains(srv.output(), "certificate not reloaded"), "not in the log yet"
	})
	c, err := dialClient(t, cfg)
	if err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
	if s := serial(c); s != 2002 {
		t.Errorf("after a failed reload: serial %d, want the previous 2002", s)
	}
}

// A certificate that cannot be loaded stops the start with its path.
func TestTLSBadCertificateRefusesToStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "cert.pem")
	os.WriteFile(bad, []byte("nope"), 0o600)
	c := &config{host: "127.0.0.1", httpPort: -1, memory: true, tlsCert: bad, tlsKey: bad}
	err := runServer(context.Background(), c, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("want an error naming %s, got %v", bad, err)
	}
	var so, se bytes.Buffer
	if code := run([]string{"serve", "--memory", "--tls-cert", bad}, &so, &se); code != 2 ||
		!strings.Contains(se.String(), "go together") {
		t.Errorf("--tls-cert without --tls-key: exit %d, %s", code, se.String())
	}
}
