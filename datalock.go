package main

// A SQLite data file belongs to one process at a time. The server holds an
// exclusive flock(2) on the file for as long as it runs, and queued migrate
// takes the same lock before it reads, so a migration never copies a file
// that a server is still changing (and no server starts on one being
// migrated). The kernel drops the lock when the process ends, kill -9
// included, so a crash leaves nothing to clean up.
//
// The lock is on the database file itself, apart from SQLite's own
// byte-range (fcntl) locks, which flock does not touch. Closing any
// descriptor of the file drops a process's fcntl locks, so the lock's
// descriptor is closed only after SQLite has closed the database.

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// errDataFileInUse says another process holds the data file.
var errDataFileInUse = errors.New("in use by a running queued server")

// lockDataFile takes the data file's lock without waiting; release gives
// it back.
func lockDataFile(path string) (release func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data path %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data path %s: %w", path, errDataFileInUse)
		}
		return nil, fmt.Errorf("data path %s: lock: %w", path, err)
	}
	return func() { f.Close() }, nil
}
