package main

// The documentation kept true: README.md and docs/*.md are read as data
// and checked against the binary. The command lists against the CLI's and
// the server's command tables, the Configuration table against the
// server's flags, every `queued ...` line of a code block against the CLI's
// parser, every relative link against the files and headings it names, and
// the README's first-job examples by running them.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// mdDoc is a markdown file split into what the tests read.
type mdDoc struct {
	path  string
	lines []string
}

func readMD(t *testing.T, path string) mdDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return mdDoc{path: path, lines: strings.Split(string(b), "\n")}
}

// docFiles is README.md and every docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("only %d files in docs/", len(files))
	}
	return append([]string{"README.md"}, files...)
}

// section returns the lines under the heading whose text is title (any
// level), up to the next heading of the same or a higher level.
func (d mdDoc) section(t *testing.T, title string) []string {
	t.Helper()
	inFence := false
	start, level := -1, 0
	for i, l := range d.lines {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
		}
		if inFence {
			continue
		}
		lv, text := headingOf(l)
		if lv == 0 {
			continue
		}
		if start >= 0 && lv <= level {
			return d.lines[start:i]
		}
		if start < 0 && text == title {
			start, level = i+1, lv
		}
	}
	if start < 0 {
		t.Fatalf("%s: no heading %q", d.path, title)
	}
	return d.lines[start:]
}

func headingOf(l string) (int, string) {
	n := 0
	for n < len(l) && l[n] == '#' {
		n++
	}
	if n == 0 || n > 6 || n >= len(l) || l[n] != ' ' {
		return 0, ""
	}
	return n, strings.TrimSpace(l[n:])
}

// tableRows returns the cells of a markdown table's body rows.
func tableRows(lines []string) [][]string {
	var rows [][]string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "| ---") {
			continue
		}
		// Split on | not escaped as \|.
		var cells []string
		var cur strings.Builder
		for i := 1; i < len(l); i++ {
			switch {
			case l[i] == '\\' && i+1 < len(l) && l[i+1] == '|':
				cur.WriteByte('|')
				i++
			case l[i] == '|':
				cells = append(cells, strings.TrimSpace(cur.String()))
				cur.Reset()
			default:
				cur.WriteByte(l[i])
			}
		}
		rows = append(rows, cells)
	}
	if len(rows) > 0 {
		rows = rows[1:] // the header
	}
	return rows
}

// codeBlocks returns the blocks of code of some lines: fenced blocks
// (with their info string) and indented ones ("" as info).
type codeBlock struct {
	info  string
	lines []string
}

func codeBlocks(lines []string) []codeBlock {
	var out []codeBlock
	var cur *codeBlock
	prevBlank := true
	for _, l := range lines {
		if cur != nil && cur.info != "" {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				out = append(out, *cur)
				cur = nil
			} else {
				cur.lines = append(cur.lines, l)
			}
			continue
		}
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "```") {
			if cur != nil {
				out = append(out, *cur)
			}
			cur = &codeBlock{info: strings.TrimPrefix(t, "```")}
			if cur.info == "" {
				cur.info = "text"
			}
			continue
		}
		indented := strings.HasPrefix(l, "    ") && strings.TrimSpace(l) != ""
		switch {
		case indented && (cur != nil || prevBlank):
			if cur == nil {
				cur = &codeBlock{}
			}
			cur.lines = append(cur.lines, strings.TrimSpace(l))
		case strings.TrimSpace(l) == "" && cur != nil:
			// A blank line may sit inside an indented block.
		default:
			if cur != nil {
				out = append(out, *cur)
				cur = nil
			}
		}
		prevBlank = strings.TrimSpace(l) == ""
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// TestREADMEConfigurationFlags: the README's Configuration table names
// every flag `queued help serve` lists and no other, with the environment
// variables the help names for it and, where the default is a plain value,
// that default.
//
// Serial: it sets environment variables (t.Setenv).
func TestREADMEConfigurationFlags(t *testing.T) {
	// Defaults as a fresh shell sees them, whatever this one has set.
	var probe []*flag.Flag
	fs, _ := serverFlags(io.Discard)
	fs.VisitAll(func(f *flag.Flag) { probe = append(probe, f) })
	envName := regexp.MustCompile(`\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\b(HOST|DATA_PATH)\b`)
	for _, f := range probe {
		for _, e := range envName.FindAllString(f.Usage, -1) {
			t.Setenv(e, "")
		}
	}
	fs, _ = serverFlags(io.Discard)
	help := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { help[f.Name] = f })

	rows := tableRows(readMD(t, "README.md").section(t, "Configuration"))
	flagName := regexp.MustCompile("`--([a-z0-9-]+)`")
	documented := map[string]bool{}
	for _, r := range rows {
		if len(r) < 4 {
			t.Fatalf("Configuration row with %d cells: %q", len(r), r)
		}
		names := flagName.FindAllStringSubmatch(r[0], -1)
		if len(names) == 0 {
			t.Fatalf("Configuration row without a flag: %q", r)
		}
		for _, m := range names {
			name := m[1]
			documented[name] = true
			f := help[name]
			if f == nil {
				t.Errorf("README Configuration lists --%s, which queued help serve does not", name)
				continue
			}
			bracket := f.Usage[strings.LastIndex(f.Usage, "["):]
			for _, e := range envName.FindAllString(bracket, -1) {
				if !strings.Contains(r[1], e) {
					t.Errorf("--%s: help names %s, the README's environment column %q does not", name, e, r[1])
				}
			}
			switch def := f.DefValue; {
			case def == "" || def == "0" || def == "false" || name == "max-connections" || name == "max-memory" || name == "max-answer-bytes":
				// No plain default, or one that depends on the machine.
			case !strings.Contains(r[2], def):
				t.Errorf("--%s: default %q, the README says %q", name, def, r[2])
			}
		}
	}
	for name := range help {
		if !documented[name] {
			t.Errorf("queued help serve lists --%s, the README's Configuration table does not", name)
		}
	}
}

// cliCommandsOf reads the command table of docs/cli.md: the words after
// `queued` in each row's first cell, up to the first argument.
func cliCommandsOf(t *testing.T) [][]string {
	t.Helper()
	rows := tableRows(readMD(t, "docs/cli.md").section(t, "Commands"))
	var out [][]string
	for _, r := range rows {
		cell := strings.Trim(r[0], "`")
		words := strings.Fields(cell)
		if len(words) < 2 || words[0] != "queued" {
			t.Fatalf("docs/cli.md: a command row that does not start with queued: %q", r[0])
		}
		var cmd []string
		for _, w := range words[1:] {
			if strings.ContainsAny(w[:1], "<[-") {
				break
			}
			cmd = append(cmd, w)
		}
		out = append(out, cmd)
	}
	return out
}

// TestDocsCLICommands: docs/cli.md lists every command and subcommand of
// the CLI (the client commands with their subcommands, and the tools),
// and nothing else.
func TestDocsCLICommands(t *testing.T) {
	t.Parallel()
	want := map[string]bool{}
	for _, c := range clientCommands {
		if c.subs == nil {
			want[c.name] = true
		}
		for _, s := range c.subs {
			want[c.name+" "+s] = true
		}
	}
	for name := range toolCommands {
		want[name] = true
	}
	got := map[string]bool{}
	for _, words := range cliCommandsOf(t) {
		key := strings.Join(words, " ")
		if len(words) > 1 && toolCommands[words[0]] != nil {
			// A tool's own words (backups list) are its business; the
			// tool is what the table is checked for.
			if words[0] != "backups" || words[1] != "list" {
				t.Errorf("docs/cli.md: %q: an unexpected word after the tool", key)
			}
			key = words[0]
		}
		if got[key] {
			t.Errorf("docs/cli.md lists %q twice", key)
		}
		got[key] = true
		if !want[key] {
			t.Errorf("docs/cli.md lists queued %s, which the CLI does not have", key)
		}
	}
	var missing []string
	for k := range want {
		if !got[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the CLI has commands docs/cli.md does not list: %q", missing)
	}
}

// TestDocsCompatibilityCommands: the protocol commands listed in
// docs/compatibility.md are exactly those the server answers.
func TestDocsCompatibilityCommands(t *testing.T) {
	t.Parallel()
	d := readMD(t, "docs/compatibility.md")
	lines := d.section(t, "Compatibility")
	start, end := -1, -1
	for i, l := range lines {
		if start < 0 && strings.HasPrefix(l, "- session:") {
			start = i
		}
		if start >= 0 && strings.HasPrefix(l, "Any other command answers") {
			end = i
			break
		}
	}
	if start < 0 || end < 0 {
		t.Fatal("docs/compatibility.md: the command list (from `- session:` to `Any other command answers`) is not there")
	}
	name := regexp.MustCompile("`([A-Za-z]+)`")
	got := map[string]bool{}
	for _, l := range lines[start:end] {
		for _, m := range name.FindAllStringSubmatch(l, -1) {
			if got[m[1]] {
				t.Errorf("docs/compatibility.md lists %s twice", m[1])
			}
			got[m[1]] = true
			if commands[m[1]].run == nil {
				t.Errorf("docs/compatibility.md lists %s, which the server does not answer", m[1])
			}
		}
	}
	for c := range commands {
		if !got[c] {
			t.Errorf("the server answers %s, docs/compatibility.md does not list it", c)
		}
	}
}

// shellWords splits a shell line into words, with quotes, backslashes and
// comments, and the operators &&, ||, ; and | as words of their own.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in := false
	flush := func() {
		if in {
			words = append(words, cur.String())
			cur.Reset()
			in = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unbalanced ' in %q", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			in = true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf(`unbalanced " in %q`, line)
			}
			in = true
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			in = true
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !in:
			flush()
			return words, nil
		case c == ';' || c == '|' || c == '&':
			flush()
			op := string(c)
			if i+1 < len(line) && line[i+1] == c && c != ';' {
				op += string(c)
				i++
			}
			words = append(words, op)
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	flush()
	return words, nil
}

var envAssign = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// queuedInvocations finds the runs of queued in a shell line: the words
// after queued (or ./queued, /usr/local/bin/queued, go run .).
func queuedInvocations(line string) ([][]string, error) {
	words, err := shellWords(line)
	if err != nil {
		return nil, err
	}
	var out [][]string
	for len(words) > 0 {
		end := slices.IndexFunc(words, func(w string) bool { return w == "&&" || w == "||" || w == ";" || w == "|" || w == "&" })
		seg := words
		if end >= 0 {
			seg, words = words[:end], words[end+1:]
		} else {
			words = nil
		}
		for len(seg) > 0 && (envAssign.MatchString(seg[0]) || seg[0] == "(") {
			seg = seg[1:]
		}
		if len(seg) == 0 {
			continue
		}
		switch prog := strings.TrimPrefix(seg[0], "("); {
		case prog == "queued" || strings.HasSuffix(prog, "/queued"):
			out = append(out, seg[1:])
		case prog == "go" && len(seg) >= 3 && seg[1] == "run" && seg[2] == ".":
			out = append(out, seg[3:])
		}
	}
	return out, nil
}

// checkQueuedLine parses one queued command line as run would, without
// sending anything: the server's flags, a client command's request, help.
func checkQueuedLine(args []string) error {
	for _, a := range args {
		if strings.Contains(a, "$(") || strings.Contains(a, "`") {
			return fmt.Errorf("a command substitution the test cannot check: %q", a)
		}
	}
	serveLine := func(a []string) error {
		fs, _ := serverFlags(io.Discard)
		fs.SetOutput(io.Discard)
		if err := fs.Parse(serverArgs(a)); err != nil {
			return fmt.Errorf("server flags: %v", err)
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("server: unexpected argument %q", fs.Arg(0))
		}
		return nil
	}
	tool := func(word string, rest []string) error {
		switch word {
		case "serve", "start":
			return serveLine(rest)
		case "help":
			if code := runHelp(rest, io.Discard, io.Discard); code != 0 {
				return fmt.Errorf("help exits %d", code)
			}
		}
		return nil // the others talk to a server or a bucket at once
	}
	// As run and cliMain dispatch a line.
	if len(args) == 0 {
		return nil
	}
	if toolCommands[args[0]] != nil {
		return tool(args[0], args[1:])
	}
	o, rest, err := parseGlobal(args)
	if err != nil {
		return err
	}
	if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
		if o.help || o.version {
			return nil
		}
		return serveLine(args)
	}
	word := rest[0]
	if toolCommands[word] != nil {
		return tool(word, slices.Delete(slices.Clone(args), o.wordAt, o.wordAt+1))
	}
	if !isClientCommand(word) {
		return fmt.Errorf("unknown command %q", word)
	}
	_, _, err = buildRequest(word, rest[1:])
	return err
}

// TestDocsCommandLines: every queued command in a code block of the README
// and the docs is one the CLI accepts, with its options, as written.
func TestDocsCommandLines(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, path := range docFiles(t) {
		for _, b := range codeBlocks(readMD(t, path).lines) {
			if b.info != "" && b.info != "sh" && b.info != "text" {
				continue // ts, js, json
			}
			for _, line := range b.lines {
				runs, err := queuedInvocations(line)
				if err != nil {
					t.Errorf("%s: %v", path, err)
					continue
				}
				for _, args := range runs {
					checked++
					if err := checkQueuedLine(args); err != nil {
						t.Errorf("%s: %q: %v", path, line, err)
					}
				}
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d queued command lines found in the docs", checked)
	}
	t.Logf("%d queued command lines checked", checked)
}

// anchors returns the anchors GitHub makes for a file's headings.
func anchors(d mdDoc) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, l := range d.lines {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
		}
		lv, text := headingOf(l)
		if inFence || lv == 0 {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocsLinks: every relative link of README.md and docs/*.md points to
// a file that exists and, when it names an anchor in a markdown file, to
// a heading there.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, path := range docFiles(t) {
		d := readMD(t, path)
		inFence := false
		for n, l := range d.lines {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				full := path
				if file != "" {
					full = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(full); err != nil {
						t.Errorf("%s:%d: link to %s: %v", path, n+1, target, err)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(full, ".md") && !anchors(readMD(t, full))[anchor] {
					t.Errorf("%s:%d: link to %s: no heading makes #%s in %s", path, n+1, target, anchor, full)
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("only %d relative links found", checked)
	}
}

var uuidLike = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// TestREADMEFirstJobBun runs the README's first.ts, as written but for the
// port, with Bun and the official client against a fresh server: it must
// print what the README shows and exit by itself.
func TestREADMEFirstJobBun(t *testing.T) {
	t.Parallel()
	dir, bun := compatDir(t)
	readme := readMD(t, "README.md")
	sec := readme.section(t, "With the official client (Bun)")
	var script, shown []string
	blocks := codeBlocks(sec)
	for i, b := range blocks {
		if b.info == "ts" {
			script = b.lines
			// The block after the command that runs it is its output.
			if i+2 < len(blocks) {
				shown = blocks[i+2].lines
			}
		}
	}
	if script == nil || len(shown) == 0 {
		t.Fatal("README: no ts block with its output under \"With the official client (Bun)\"")
	}
	if !slices.Contains(blocks[len(blocks)-2].lines, "bun first.ts") {
		t.Fatalf("README: the script is not run with `bun first.ts`: %q", blocks[len(blocks)-2].lines)
	}
	src := strings.Join(script, "\n")
	if strings.Count(src, "port: 6789") != 1 {
		t.Fatal("README's first.ts: expected one `port: 6789` to point at the test server")
	}
	srv := startBinary(t, "--memory")
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	src = strings.Replace(src, "port: 6789", fmt.Sprintf("port: %d", srv.tcpPort), 1)
	if err := os.WriteFile(filepath.Join(work, "first.ts"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// Generous: the point is that it exits at all (it used not to).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bun, "first.ts")
	cmd.Dir = work
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("first.ts did not exit within 60s:\n%s\n--- server\n%s", out, srv.output())
	}
	if err != nil {
		t.Fatalf("first.ts: %v\n%s\n--- server\n%s", err, out, srv.output())
	}
	got := uuidLike.ReplaceAllString(string(out), "ID")
	for _, l := range shown {
		if !strings.Contains(got, uuidLike.ReplaceAllString(l, "ID")) {
			t.Errorf("the README shows %q; first.ts printed:\n%s", l, out)
		}
	}
}

// TestREADMEFirstJobCLI runs the README's command-line first job, each
// line as written, against a fresh server on a free port (TCP_PORT, which
// the CLI reads as its default port).
func TestREADMEFirstJobCLI(t *testing.T) {
	t.Parallel()
	bin := queuedBinary(t)
	sec := readMD(t, "README.md").section(t, "With the queued command line")
	blocks := codeBlocks(sec)
	if len(blocks) == 0 {
		t.Fatal("README: no commands under \"With the queued command line\"")
	}
	srv := startBinary(t, "--memory")
	var outs []string
	for _, line := range blocks[0].lines {
		runs, err := queuedInvocations(line)
		if err != nil || len(runs) != 1 || !strings.HasPrefix(line, "./queued ") {
			t.Fatalf("README: %q is not one ./queued command (%v)", line, err)
		}
		cmd := exec.Command(bin, runs[0]...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("TCP_PORT=%d", srv.tcpPort), "HOST=", "BQ_TOKEN=", "BUNQUEUE_TOKEN=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s%s", line, err, stdout.String(), stderr.String())
		}
		outs = append(outs, stdout.String())
	}
	all := strings.Join(outs, "")
	for _, want := range []string{"Job created: cat-1", "Job cat-1 completed", "completed", `"width": 128`} {
		if !strings.Contains(all, want) {
			t.Errorf("the commands did not print %q:\n%s", want, all)
		}
	}
	text := strings.Join(sec, "\n")
	for _, said := range []string{"Job created: cat-1", "Job cat-1 completed"} {
		if !strings.Contains(text, said) {
			t.Errorf("the README no longer says %q", said)
		}
	}
}
