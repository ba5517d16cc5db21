package main

// A small S3 client on the standard library: AWS Signature Version 4, the
// handful of object operations backups need (put, multipart upload, get,
// list, delete), path-style and virtual-hosted addressing, and any
// S3-compatible endpoint (MinIO, R2, Garage, Backblaze B2...).
//
// Every request carries the SHA-256 of its payload in x-amz-content-sha256
// and signs it, so the service rejects a body altered on the way. Secrets
// live in the secret type, which prints as [redacted] through every
// formatter, and error texts from the service are scrubbed of them, so
// neither logs nor errors can carry a credential.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	// S3 takes parts of 5 MiB to 5 GiB, at most 10,000 of them. 16 MiB
	// keeps a part in flight small and still covers 156 GiB.
	defaultPartSize = 16 << 20
	minPartSize     = 5 << 20
	maxParts        = 10000
)

// secret is a credential. It formats as [redacted] with fmt, slog and
// encoders, so it cannot reach a log line or an error by accident; the
// signer converts it explicitly.
type secret string

func (secret) String() string               { return "[redacted]" }
func (secret) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }
func (secret) Format(f fmt.State, _ rune)   { io.WriteString(f, "[redacted]") }
func (s secret) redactIn(text string) string {
	if len(s) < 4 { // too short to tell apart from ordinary text
		return text
	}
	return strings.ReplaceAll(text, string(s), "[redacted]")
}

// s3Credentials are static keys, optionally with a session token (STS).
type s3Credentials struct {
	AccessKeyID  string
	Secret       secret
	SessionToken secret
}

// ---------------------------------------------------------------------------
// Signature Version 4

// sigV4Signer signs requests for one service in one region.
type sigV4Signer struct {
	creds   s3Credentials
	region  string
	service string
}

// sigV4Result keeps the intermediate strings; the tests compare them with
// the published ones, and they help when a service disagrees.
type sigV4Result struct {
	CanonicalRequest string
	StringToSign     string
	Authorization    string
}

// sign adds X-Amz-Date, the session token when there is one, and
// Authorization to req, signing every header already set (callers set
// x-amz-content-sha256 for S3). payloadHash is the hex SHA-256 of the body.
// It rewrites req.URL's path and query into their canonical encoding so
// that what is sent is exactly what was signed. The canonical URI follows
// S3's rules: each segment is encoded once and the path is not normalised.
func (s *sigV4Signer) sign(req *http.Request, payloadHash string, now time.Time) sigV4Result {
	amzDate := now.UTC().Format("20060102T150405Z")
	date := amzDate[:8]
	req.Header.Set("X-Amz-Date", amzDate)
	if s.creds.SessionToken != "" {
		req.Header.Set("X-Amz-Security-Token", string(s.creds.SessionToken))
	}
	path := req.URL.Path
	if path == "" {
		path = "/"
	}
	uri := uriEncode(path, true)
	req.URL.Path, req.URL.RawPath = path, uri
	query := canonicalQuery(req.URL.RawQuery)
	req.URL.RawQuery = query
	headers, signed := canonicalHeaders(req)
	creq := req.Method + "\n" + uri + "\n" + query + "\n" + headers + "\n" + signed + "\n" + payloadHash
	scope := date + "/" + s.region + "/" + s.service + "/aws4_request"
	sts := "AWS4-HMAC-SHA256\n" + amzDate + "\n" + scope + "\n" + hexSHA256([]byte(creq))
	key := sigV4Key(s.creds.Secret, date, s.region, s.service)
	sig := hex.EncodeToString(hmacSHA256(key, []byte(sts)))
	authz := "AWS4-HMAC-SHA256 Credential=" + s.creds.AccessKeyID + "/" + scope +
		", SignedHeaders=" + signed + ", Signature=" + sig
	req.Header.Set("Authorization", authz)
	return sigV4Result{CanonicalRequest: creq, StringToSign: sts, Authorization: authz}
}

// sigV4Key derives the signing key for one day, region and service.
func sigV4Key(sec secret, date, region, service string) []byte {
	k := hmacSHA256([]byte("AWS4"+string(sec)), []byte(date))
	k = hmacSHA256(k, []byte(region))
	k = hmacSHA256(k, []byte(service))
	return hmacSHA256(k, []byte("aws4_request"))
}

func hmacSHA256(key, data []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(data)
	return h.Sum(nil)
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// uriEncode percent-encodes every byte but the unreserved characters of
// RFC 3986 (and '/' when keepSlash), with upper-case hex, as SigV4 wants;
// url.PathEscape and QueryEscape leave other characters alone or write
// spaces as '+'.
func uriEncode(s string, keepSlash bool) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9',
			c == '-', c == '_', c == '.', c == '~', keepSlash && c == '/':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

// canonicalQuery decodes a raw query and encodes it again the SigV4 way,
// sorted by name then value; a parameter without '=' gets an empty value.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	var pairs [][2]string
	for part := range strings.SplitSeq(raw, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		// PathUnescape, not QueryUnescape: a '+' the caller sent is a
		// literal plus to S3.
		if dk, err := url.PathUnescape(k); err == nil {
			k = dk
		}
		if dv, err := url.PathUnescape(v); err == nil {
			v = dv
		}
		pairs = append(pairs, [2]string{uriEncode(k, false), uriEncode(v, false)})
	}
	slices.SortFunc(pairs, func(a, b [2]string) int {
		if c := strings.Compare(a[0], b[0]); c != 0 {
			return c
		}
		return strings.Compare(a[1], b[1])
	})
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p[0])
		b.WriteByte('=')
		b.WriteString(p[1])
	}
	return b.String()
}

// canonicalHeaders lists host and every header set on req (but
// Authorization and User-Agent, which proxies may rewrite) with lower-case
// names, trimmed values with inner runs of spaces folded, and repeated
// headers joined by commas.
func canonicalHeaders(req *http.Request) (canon, signed string) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	vals := map[string][]string{"host": {host}}
	for k, vs := range req.Header {
		lk := strings.ToLower(k)
		if lk == "authorization" || lk == "user-agent" || lk == "host" {
			continue
		}
		vals[lk] = append(vals[lk], vs...)
	}
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte(':')
		for i, v := range vals[n] {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strings.Join(strings.Fields(v), " "))
		}
		b.WriteByte('\n')
	}
	return b.String(), strings.Join(names, ";")
}

// ---------------------------------------------------------------------------
// Configuration

// S3Config says where and how to reach the bucket.
type S3Config struct {
	// Endpoint is the service's base URL; empty means AWS in Region.
	Endpoint string
	Region   string
	Bucket   string
	// Addressing is "path" (https://host/bucket/key), "virtual"
	// (https://bucket.host/key) or "auto": virtual-hosted on AWS when the
	// bucket name allows it, path-style on custom endpoints, which often
	// have no wildcard DNS for bucket names.
	Addressing string
	Creds      s3Credentials
}

// LogValue keeps the credentials out of logs even if a whole config is
// logged.
func (c S3Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("endpoint", c.Endpoint), slog.String("region", c.Region),
		slog.String("bucket", c.Bucket), slog.String("addressing", c.Addressing))
}

// S3Client talks to one bucket.
type S3Client struct {
	base      *url.URL // scheme, host and optional path prefix of the service
	bucket    string
	pathStyle bool
	signer    sigV4Signer
	http      *http.Client
	log       *slog.Logger
	now       func() time.Time
	partSize  int64
	attempts  int           // tries per request
	retryBase time.Duration // first pause between tries, doubling
}

// NewS3Client checks cfg and makes a client. hc may be nil.
func NewS3Client(cfg S3Config, hc *http.Client, log *slog.Logger) (*S3Client, error) {
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.Creds.AccessKeyID == "" || cfg.Creds.Secret == "" {
		return nil, errors.New("S3 credentials missing: set --s3-access-key and --s3-secret-key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	aws := cfg.Endpoint == ""
	ep := cfg.Endpoint
	if aws {
		ep = "https://s3." + cfg.Region + ".amazonaws.com"
	} else if !strings.Contains(ep, "://") {
		ep = "https://" + ep
	}
	base, err := url.Parse(ep)
	if err != nil || base.Host == "" || (base.Scheme != "http" && base.Scheme != "https") || base.RawQuery != "" {
		return nil, fmt.Errorf("S3 endpoint %q: want http(s)://host[:port][/path]", cfg.Endpoint)
	}
	if base.User != nil {
		return nil, errors.New("S3 endpoint: put credentials in --s3-access-key and --s3-secret-key, not in the URL")
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	var pathStyle bool
	switch cfg.Addressing {
	case "", "auto":
		pathStyle = !aws || !dnsBucketName(cfg.Bucket)
	case "path":
		pathStyle = true
	case "virtual":
		if !dnsBucketName(cfg.Bucket) {
			return nil, fmt.Errorf("bucket %q cannot be addressed virtual-hosted style (a host name needs lower-case letters, digits and hyphens)", cfg.Bucket)
		}
	default:
		return nil, fmt.Errorf("S3 addressing %q: want auto, path or virtual", cfg.Addressing)
	}
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		// No overall timeout (a large part takes what it takes), but a
		// service that accepts a request and never answers is given up on.
		t.ResponseHeaderTimeout = 2 * time.Minute
		hc = &http.Client{Transport: t}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &S3Client{base: base, bucket: cfg.Bucket, pathStyle: pathStyle,
		signer: sigV4Signer{creds: cfg.Creds, region: cfg.Region, service: "s3"},
		http:   hc, log: log, now: time.Now, partSize: defaultPartSize, attempts: 4, retryBase: 250 * time.Millisecond}, nil
}

// dnsBucketName reports whether a bucket name can be a host label:
// virtual-hosted addressing (and TLS certificates) need that.
func dnsBucketName(b string) bool {
	if len(b) < 3 || len(b) > 63 || b[0] == '-' || b[len(b)-1] == '-' {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// objectURL is where a key (or, with key "", the bucket) lives.
func (c *S3Client) objectURL(key string, query url.Values) *url.URL {
	u := *c.base
	if c.pathStyle {
		u.Path = c.base.Path + "/" + c.bucket
		if key != "" {
			u.Path += "/" + key
		}
	} else {
		u.Host = c.bucket + "." + c.base.Host
		u.Path = c.base.Path + "/" + key
	}
	u.RawPath = ""
	// Not query.Encode(): it writes a space as '+', which S3 reads as a
	// plus sign.
	var q []string
	for k, vs := range query {
		for _, v := range vs {
			q = append(q, uriEncode(k, false)+"="+uriEncode(v, false))
		}
	}
	slices.Sort(q)
	u.RawQuery = strings.Join(q, "&")
	return &u
}

// ---------------------------------------------------------------------------
// Requests

// S3Error is an answer from the service that is not a success.
type S3Error struct {
	Op        string // what was attempted, e.g. "PUT s3://bucket/key"
	Status    int
	Code      string
	Message   string
	RequestID string
}

func (e *S3Error) Error() string {
	s := fmt.Sprintf("%s: %d", e.Op, e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RequestID != "" {
		s += " (request id " + e.RequestID + ")"
	}
	return s
}

// retryable: throttling and the service's own failures pass; refusals
// (bad signature, no such bucket, access denied) do not.
func (e *S3Error) retryable() bool {
	switch e.Code {
	case "RequestTimeout", "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed":
		return true
	}
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

// isS3NotFound reports a missing key or bucket.
func isS3NotFound(err error) bool {
	var se *S3Error
	return errors.As(err, &se) && se.Status == http.StatusNotFound
}

// s3Payload is a request body that can be read again for a retry.
type s3Payload struct {
	open   func() io.Reader
	size   int64
	sha256 string
}

func bytesPayload(b []byte) *s3Payload {
	return &s3Payload{open: func() io.Reader { return bytes.NewReader(b) }, size: int64(len(b)), sha256: hexSHA256(b)}
}

// sectionPayload hashes a slice of a file; the body is read again when sent.
func sectionPayload(r io.ReaderAt, off, n int64) (*s3Payload, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(r, off, n)); err != nil {
		return nil, fmt.Errorf("reading the upload: %w", err)
	}
	return &s3Payload{open: func() io.Reader { return io.NewSectionReader(r, off, n) }, size: n,
		sha256: hex.EncodeToString(h.Sum(nil))}, nil
}

// do sends one signed request, trying again with backoff when the failure
// may pass. The caller closes the response body.
func (c *S3Client) do(ctx context.Context, method, key string, query url.Values, hdr http.Header, body *s3Payload) (*http.Response, error) {
	op := method + " s3://" + c.bucket + "/" + key
	if len(query) > 0 {
		op += "?" + strings.Join(slices.Sorted(maps.Keys(query)), "&")
	}
	pause := c.retryBase
	for attempt := 1; ; attempt++ {
		resp, err := c.once(ctx, op, method, key, query, hdr, body)
		if err == nil {
			return resp, nil
		}
		var se *S3Error
		transient := ctx.Err() == nil && (!errors.As(err, &se) || se.retryable())
		if !transient || attempt >= c.attempts {
			return nil, err
		}
		wait := pause/2 + rand.N(pause) // jitter, so many clients do not retry in step
		c.log.Warn("S3 request failed; retrying", "op", op, "attempt", attempt, "retry_in", wait.Round(time.Millisecond).String(), "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", op, ctx.Err())
		case <-time.After(wait):
		}
		pause *= 2
	}
}

func (c *S3Client) once(ctx context.Context, op, method, key string, query url.Values, hdr http.Header, body *s3Payload) (*http.Response, error) {
	u := c.objectURL(key, query)
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	req.URL = u
	for k, vs := range hdr {
		req.Header[k] = slices.Clone(vs)
	}
	hash := emptySHA256
	if body != nil {
		hash = body.sha256
		req.ContentLength = body.size
		req.Body = io.NopCloser(body.open())
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.open()), nil }
		if body.size == 0 {
			req.Body = http.NoBody
		}
	}
	req.Header.Set("X-Amz-Content-Sha256", hash)
	c.signer.sign(req, hash, c.now())
	req.Header.Set("User-Agent", "queued/"+version)
	resp, err := c.http.Do(req)
	if err != nil {
		// url.Error names the URL, which holds no credential.
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, c.errorFrom(op, resp)
}

// errorFrom reads an S3 error document. Only its code, message and request
// id are kept: a SignatureDoesNotMatch answer also echoes the string to
// sign and the canonical request, which name the access key and token.
func (c *S3Client) errorFrom(op string, resp *http.Response) error {
	var doc struct {
		Code      string `xml:"Code"`
		Message   string `xml:"Message"`
		RequestID string `xml:"RequestId"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	xml.Unmarshal(b, &doc)
	e := &S3Error{Op: op, Status: resp.StatusCode, Code: doc.Code, RequestID: doc.RequestID}
	if e.Code == "" && resp.StatusCode == http.StatusNotFound {
		e.Code = "NotFound" // HEAD answers have no body
	}
	msg := doc.Message
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	e.Message = c.scrub(msg)
	return e
}

func (c *S3Client) scrub(s string) string {
	return c.signer.creds.SessionToken.redactIn(c.signer.creds.Secret.redactIn(s))
}

// ---------------------------------------------------------------------------
// Operations

// S3Object is one entry of a listing.
type S3Object struct {
	Key          string
	Size         int64
	LastModified time.Time
}

// PutObject uploads a small object in one request.
func (c *S3Client) PutObject(ctx context.Context, key string, body *s3Payload, meta map[string]string) error {
	resp, err := c.do(ctx, http.MethodPut, key, nil, metaHeaders(meta), body)
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

func metaHeaders(meta map[string]string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/octet-stream")
	for k, v := range meta {
		h.Set("X-Amz-Meta-"+k, v)
	}
	return h
}

func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
}

// UploadFile stores a file under key with user metadata, in one request up
// to the part size and as a multipart upload above it.
func (c *S3Client) UploadFile(ctx context.Context, key, path string, meta map[string]string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if fi.Size() <= c.partSize {
		body, err := sectionPayload(f, 0, fi.Size())
		if err != nil {
			return err
		}
		return c.PutObject(ctx, key, body, meta)
	}
	return c.multipartUpload(ctx, key, f, fi.Size(), meta)
}

type completedPart struct {
	PartNumber int    `xml:"PartNumber"`
	ETag       string `xml:"ETag"`
}

// multipartUpload sends the file in parts, one after another (memory stays
// at one part's hash state; a failed part is retried alone), and aborts the
// upload on failure so the service does not keep (and bill) orphan parts.
func (c *S3Client) multipartUpload(ctx context.Context, key string, f io.ReaderAt, size int64, meta map[string]string) (err error) {
	partSize := max(c.partSize, (size+maxParts-1)/maxParts)
	resp, err := c.do(ctx, http.MethodPost, key, url.Values{"uploads": {""}}, metaHeaders(meta), nil)
	if err != nil {
		return err
	}
	var created struct {
		UploadID string `xml:"UploadId"`
	}
	err = xml.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&created)
	drain(resp)
	if err != nil || created.UploadID == "" {
		return fmt.Errorf("POST s3://%s/%s?uploads: no upload id in the answer (%v)", c.bucket, key, err)
	}
	id := created.UploadID
	defer func() {
		if err == nil {
			return
		}
		// Even when ctx was cancelled (shutdown), ask the service to drop
		// the parts, briefly.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if resp, aerr := c.do(actx, http.MethodDelete, key, url.Values{"uploadId": {id}}, nil, nil); aerr != nil {
			c.log.Warn("S3 multipart upload not aborted; its parts may linger until a lifecycle rule removes them",
				"bucket", c.bucket, "key", key, "err", aerr)
		} else {
			drain(resp)
		}
	}()
	var parts []completedPart
	for off, n := int64(0), 1; off < size; off, n = off+partSize, n+1 {
		body, err := sectionPayload(f, off, min(partSize, size-off))
		if err != nil {
			return err
		}
		q := url.Values{"partNumber": {strconv.Itoa(n)}, "uploadId": {id}}
		resp, err := c.do(ctx, http.MethodPut, key, q, nil, body)
		if err != nil {
			return err
		}
		etag := resp.Header.Get("ETag")
		drain(resp)
		if etag == "" {
			return fmt.Errorf("PUT s3://%s/%s part %d: no ETag in the answer", c.bucket, key, n)
		}
		parts = append(parts, completedPart{PartNumber: n, ETag: etag})
	}
	doc, err := xml.Marshal(struct {
		XMLName xml.Name        `xml:"CompleteMultipartUpload"`
		Parts   []completedPart `xml:"Part"`
	}{Parts: parts})
	if err != nil {
		return err
	}
	hdr := http.Header{"Content-Type": {"application/xml"}}
	resp, err = c.do(ctx, http.MethodPost, key, url.Values{"uploadId": {id}}, hdr, bytesPayload(doc))
	if err != nil {
		return err
	}
	defer drain(resp)
	// The service may fail the completion after answering 200: the error
	// is then in the body.
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("POST s3://%s/%s?uploadId: reading the answer: %w", c.bucket, key, err)
	}
	var root struct {
		XMLName xml.Name
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	if xml.Unmarshal(b, &root) == nil && root.XMLName.Local == "Error" {
		return &S3Error{Op: "POST s3://" + c.bucket + "/" + key + "?uploadId", Status: resp.StatusCode,
			Code: root.Code, Message: c.scrub(root.Message)}
	}
	return nil
}

// GetObject opens an object for reading; the headers carry its metadata.
func (c *S3Client) GetObject(ctx context.Context, key string) (io.ReadCloser, http.Header, error) {
	resp, err := c.do(ctx, http.MethodGet, key, nil, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	return resp.Body, resp.Header, nil
}

// DeleteObject removes a key; a missing key is not an error (S3 says so too).
func (c *S3Client) DeleteObject(ctx context.Context, key string) error {
	resp, err := c.do(ctx, http.MethodDelete, key, nil, nil, nil)
	if err != nil {
		if isS3NotFound(err) {
			return nil
		}
		return err
	}
	drain(resp)
	return nil
}

// List returns every object whose key starts with prefix, in key order.
func (c *S3Client) List(ctx context.Context, prefix string) ([]S3Object, error) {
	var out []S3Object
	token := ""
	for {
		q := url.Values{"list-type": {"2"}, "prefix": {prefix}}
		if token != "" {
			q.Set("continuation-token", token)
		}
		resp, err := c.do(ctx, http.MethodGet, "", q, nil, nil)
		if err != nil {
			return nil, err
		}
		var page struct {
			IsTruncated bool   `xml:"IsTruncated"`
			NextToken   string `xml:"NextContinuationToken"`
			Contents    []struct {
				Key          string `xml:"Key"`
				Size         int64  `xml:"Size"`
				LastModified string `xml:"LastModified"`
			} `xml:"Contents"`
		}
		err = xml.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&page)
		drain(resp)
		if err != nil {
			return nil, fmt.Errorf("GET s3://%s?list-type=2: unreadable listing: %w", c.bucket, err)
		}
		for _, o := range page.Contents {
			t, _ := time.Parse(time.RFC3339Nano, o.LastModified)
			out = append(out, S3Object{Key: o.Key, Size: o.Size, LastModified: t})
		}
		if !page.IsTruncated || page.NextToken == "" {
			break
		}
		token = page.NextToken
	}
	slices.SortFunc(out, func(a, b S3Object) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// parseS3URL splits s3://bucket/key.
func parseS3URL(s string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		return "", "", fmt.Errorf("%q: want s3://bucket/key", s)
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("%q: no bucket", s)
	}
	return bucket, key, nil
}
