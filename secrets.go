package main

// Keeping credentials out of what the binary prints: help texts (whose
// flag defaults come from the environment), error messages and logs.
//
// Tokens are never shown, not even in part. A PostgreSQL connection
// string is shown with its password masked (postgres://user:xxxxx@host/db),
// since the host, user and database are what an operator needs to see to
// tell which database a message is about.

import (
	"net/url"
	"regexp"
	"strings"
)

// maskedPassword stands for a password in a connection string.
const maskedPassword = "xxxxx"

// hiddenFlag is a string flag whose value (and default, which comes from
// the environment) is never printed: flag.PrintDefaults shows the default
// of a flag by calling String when the flag set is made, so a plain
// StringVar with an environment default puts the token in `queued help
// serve` and in the usage a mistyped flag prints.
type hiddenFlag struct{ p *string }

func (f hiddenFlag) String() string     { return "" }
func (f hiddenFlag) Set(s string) error { *f.p = s; return nil }

// dsnFlag is a PostgreSQL connection string flag that prints with its
// password masked.
type dsnFlag struct{ p *string }

func (f dsnFlag) String() string {
	if f.p == nil {
		return ""
	}
	return redactDSN(*f.p)
}
func (f dsnFlag) Set(s string) error { *f.p = s; return nil }

// fromEnvNote tells a help reader that a hidden flag has a value from the
// environment, without showing it.
func fromEnvNote(keys []string) string {
	for _, k := range keys {
		if envOr([]string{k}, "") != "" {
			return " (set from " + k + ", not shown)"
		}
	}
	return ""
}

var (
	// password=... in a keyword/value connection string, quoted or not;
	// sslpassword too.
	kvPasswordRE = regexp.MustCompile(`(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)
	// user:password@ after a scheme, for a URL that does not parse.
	userinfoRE = regexp.MustCompile(`(://[^:/@\s]*:)([^@\s]*)@`)
)

// redactDSN masks the passwords of a PostgreSQL connection string: the
// userinfo password and password/sslpassword parameters of a URL, or the
// password keywords of a keyword/value string.
func redactDSN(s string) string {
	if s == "" {
		return ""
	}
	if !strings.Contains(s, "://") {
		return kvPasswordRE.ReplaceAllString(s, "${1}"+maskedPassword)
	}
	u, err := url.Parse(s)
	if err != nil {
		// Best effort on what does not parse: over-masking is fine.
		s = userinfoRE.ReplaceAllString(s, "${1}"+maskedPassword+"@")
		return kvPasswordRE.ReplaceAllString(s, "${1}"+maskedPassword)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), maskedPassword)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") {
				q.Set(k, maskedPassword)
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// dsnPasswords are the passwords a connection string holds, in every
// spelling they may take in a message: as written and percent-decoded.
func dsnPasswords(s string) []string {
	var out []string
	add := func(p string) {
		if p != "" && p != maskedPassword { // a short one garbles the message, but shows nothing
			out = append(out, p)
			if d, err := url.PathUnescape(p); err == nil && d != p {
				out = append(out, d)
			}
			if d, err := url.QueryUnescape(p); err == nil && d != p {
				out = append(out, d)
			}
		}
	}
	if strings.Contains(s, "://") {
		if m := userinfoRE.FindStringSubmatch(s); m != nil {
			add(m[2])
		}
		if u, err := url.Parse(s); err == nil {
			if u.User != nil {
				if p, ok := u.User.Password(); ok {
					add(p)
				}
			}
			for k, vs := range u.Query() {
				if strings.Contains(strings.ToLower(k), "password") {
					for _, v := range vs {
						add(v)
					}
				}
			}
		}
	}
	for _, m := range kvPasswordRE.FindAllStringSubmatch(s, -1) {
		add(strings.Trim(m[2], "'"))
	}
	return out
}

// redactIn masks the connection string's passwords, and the string itself,
// wherever they appear in text (an error message from a driver, say).
func redactIn(text, dsn string) string {
	if dsn == "" {
		return text
	}
	text = strings.ReplaceAll(text, dsn, redactDSN(dsn))
	for _, p := range dsnPasswords(dsn) {
		text = strings.ReplaceAll(text, p, maskedPassword)
	}
	return text
}

// redactURL masks the password of a URL's userinfo (a webhook's address,
// say); anything else is returned as it is.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); !has {
		return s
	}
	u.User = url.UserPassword(u.User.Username(), maskedPassword)
	return u.String()
}

// redactedErr is an error whose text had a secret masked. It still
// unwraps to the error it was made from, so that what kind of failure it
// was can be told (pgUnreachable); only its own text may be printed.
type redactedErr struct {
	msg string
	err error
}

func (e *redactedErr) Error() string { return e.msg }
func (e *redactedErr) Unwrap() error { return e.err }
