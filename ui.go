package main

// The dashboard: a page embedded in the binary (web/), served at / with
// its files under /ui/. It is plain HTML, CSS and JavaScript, with no
// build step and nothing loaded from other hosts.
//
// The files carry no data, so they are served without a token; every call
// the page makes for data goes through the API and asks for the token
// when the server has them.

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"
)

//go:embed web
var webFiles embed.FS

func (a *httpAPI) addUIRoutes() {
	files, _ := fs.Sub(webFiles, "web")
	serve := func(w http.ResponseWriter, r *http.Request, name string) {
		b, err := fs.ReadFile(files, name)
		if err != nil {
			writeJSON(w, http.StatusNotFound, map[string]any{"ok": false, "error": "Not found"})
			return
		}
		ct := mime.TypeByExtension(path.Ext(name))
		if ct == "" {
			ct = "application/octet-stream"
		}
		h := w.Header()
		h.Set("Content-Type", ct)
		// The page is small and changes with the binary: always revalidate.
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		// Nothing from elsewhere: no script, style, image or connection to
		// another host, and no framing by another site.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		w.Write(b)
	}
	a.handle("GET", "/", routeOpen, func(w http.ResponseWriter, r *http.Request, _ []string) { serve(w, r, "index.html") })
	a.handle("GET", "/ui/:file", routeOpen, func(w http.ResponseWriter, r *http.Request, p []string) { serve(w, r, p[0]) })
}
