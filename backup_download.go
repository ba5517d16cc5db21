package main

// GET /backup: a consistent copy of the live SQLite database, made on disk
// (VACUUM INTO) and streamed to the caller.
//
// Each download costs a full copy of the database on disk for as long as
// the client takes to read it, so they are taken one at a time: a second
// request while one is in progress is answered 429 with Retry-After,
// rather than left waiting (a client that reads slowly would otherwise
// hold every other one). The copy is made beside the database (a /tmp in
// memory would hold a copy of the whole database in RAM) under a name only
// this code makes, is removed when the request ends however it ends (done,
// client gone, write deadline, shutdown, error), and copies a killed
// process left behind are removed at the next start: the database file is
// locked by one server at a time, so what sits beside it is that server's.

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	// downloadChunk is written at a time, each write under its own
	// deadline.
	downloadChunk = 256 << 10
	// downloadWriteTimeout bounds one chunk's write: a client that stops
	// reading lets go of the backup slot after this.
	downloadWriteTimeout = 60 * time.Second
	// downloadRetryAfter is the Retry-After of a refused second download,
	// in seconds.
	downloadRetryAfter = 10
)

// downloadPrefix is the name prefix of the copies GET /backup makes beside
// the database at dataPath.
func downloadPrefix(dataPath string) string {
	return "." + filepath.Base(dataPath) + ".download-"
}

// removeStaleDownloads deletes the copies a killed server left beside the
// database. Call it once the data file is locked.
func removeStaleDownloads(dataPath string, log *slog.Logger) {
	dir, prefix := filepath.Dir(dataPath), downloadPrefix(dataPath)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			log.Warn("a backup copy left by an earlier run could not be removed", "path", p, "err", err)
		} else {
			log.Info("removed a backup copy left by an earlier run", "path", p)
		}
	}
}

// fileCopier copies the data file consistently to dst (SQLiteStore.Backup).
type fileCopier interface {
	Backup(ctx context.Context, dst string) error
}

func (a *httpAPI) serveBackupDownload(w http.ResponseWriter, r *http.Request, _ []string) {
	bk := a.dataFile
	if bk == nil {
		writeJSON(w, http.StatusConflict, map[string]any{"ok": false, "error": "backup needs SQLite storage; " + noSQLiteBackup(a.srv.pg != nil)})
		return
	}
	if !a.backupBusy.CompareAndSwap(false, true) {
		w.Header().Set("Retry-After", strconv.Itoa(downloadRetryAfter))
		writeJSON(w, http.StatusTooManyRequests, map[string]any{"ok": false,
			"error": "a backup download is in progress; they are taken one at a time (each is a full copy of the database on disk): try again when it is done"})
		return
	}
	defer a.backupBusy.Store(false)
	// The client hanging up, or the server shutting down, ends it.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(a.ctx, cancel)()

	dir, prefix := "", "queued-download-" // the system's temp folder, without a data file
	if a.dataPath != "" {
		dir, prefix = filepath.Dir(a.dataPath), downloadPrefix(a.dataPath)
	}
	tmpDir, err := os.MkdirTemp(dir, prefix)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": "backup: " + err.Error()})
		return
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "backup.db")
	if err := bk.Backup(ctx, tmp); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": err.Error()})
		return
	}
	f, err := os.Open(tmp)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": "backup: " + err.Error()})
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "error": "backup: " + err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/vnd.sqlite3")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.Header().Set("Content-Disposition", `attachment; filename="queued-backup.db"`)
	// a.ctx too: its end reaches ctx through AfterFunc's goroutine, a
	// chunk or two late.
	if err := copyWithDeadlines(ctx, a.ctx, w, f); err != nil {
		a.srv.log.Debug("backup download ended early", "remote", r.RemoteAddr, "err", err)
	}
}

// copyWithDeadlines copies src to an HTTP answer a chunk at a time, each
// write under downloadWriteTimeout, until ctx or stop ends.
func copyWithDeadlines(ctx, stop context.Context, w http.ResponseWriter, src io.Reader) error {
	rc := http.NewResponseController(w)
	// The connection may carry other requests after this one, and the
	// server sets no deadline of its own (no WriteTimeout): clear ours.
	defer rc.SetWriteDeadline(time.Time{})
	buf := make([]byte, downloadChunk)
	for {
		if err := cmp.Or(ctx.Err(), stop.Err()); err != nil {
			return err
		}
		n, rerr := src.Read(buf)
		if n > 0 {
			// Not every ResponseWriter has deadlines (a test's recorder);
			// the server's does.
			if err := rc.SetWriteDeadline(time.Now().Add(downloadWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return err
			}
			if _, err := w.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}
