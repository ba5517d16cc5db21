// The entrypoint of the stand-in for the official postgres image that
// TestComposeTwoBrokers builds when Docker Hub is out of reach
// (container_compose_test.go): on an empty data folder it makes the
// cluster as the official image does (superuser POSTGRES_USER with
// POSTGRES_PASSWORD, database POSTGRES_DB, password authentication for
// other hosts, trust on the local socket), then becomes the server,
// listening on every interface. Built static (CGO_ENABLED=0), it runs as
// the image's user, 999, and needs no shell itself (initdb does).
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	data := os.Getenv("PGDATA")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := initialise(data); err != nil {
			fmt.Fprintln(os.Stderr, "entrypoint:", err)
			os.Exit(1)
		}
	}
	postgres, err := exec.LookPath("postgres")
	if err == nil {
		args := append([]string{"postgres", "-D", data, "-c", "listen_addresses=*"}, os.Args[1:]...)
		err = syscall.Exec(postgres, args, os.Environ())
	}
	fmt.Fprintln(os.Stderr, "entrypoint:", err)
	os.Exit(1)
}

// initialise makes the cluster in the empty folder data.
func initialise(data string) error {
	user := env("POSTGRES_USER", "postgres")
	password := os.Getenv("POSTGRES_PASSWORD")
	if password == "" {
		return errors.New("POSTGRES_PASSWORD is not set")
	}
	db := env("POSTGRES_DB", user)
	pwfile := filepath.Join(filepath.Dir(data), ".pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	// The data is thrown away with the volume: no fsync of the new cluster.
	if err := run("", "initdb", "-D", data, "-U", user, "--pwfile="+pwfile, "--auth-local=trust",
		"--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		return err
	}
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = hba.WriteString("host all all all scram-sha-256\n")
	if cerr := hba.Close(); err == nil {
		err = cerr
	}
	if err != nil || db == "postgres" {
		return err
	}
	// Single-user mode: no server to start and stop, and no socket on which
	// pg_isready would report ready before the database is there.
	create := `CREATE DATABASE "` + strings.ReplaceAll(db, `"`, `""`) + "\";\n"
	return run(create, "postgres", "--single", "-D", data, "postgres")
}

// run runs a command with stdin, its output passed on; an error printed by
// a single-user backend, which exits 0 regardless, is an error too.
func run(stdin, name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = io.MultiWriter(os.Stdout, &out), io.MultiWriter(os.Stderr, &out)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if bytes.Contains(out.Bytes(), []byte("ERROR:")) {
		return fmt.Errorf("%s failed", name)
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
