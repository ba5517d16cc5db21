package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Signature Version 4: published vectors

// The aws-sig-v4-test-suite (the 2015-08-30 edition AWS published with its
// SigV4 documentation): one set of credentials, a made-up "service" in
// us-east-1, and for each case the request, the canonical request, the
// string to sign and the Authorization header. Only cases whose canonical
// URI is the same under S3's rules (no path normalisation, single
// encoding) and the generic ones are included; their paths have no dot
// segments, repeated slashes or reserved characters.
const (
	suiteKey    = "AKIDEXAMPLE"
	suiteSecret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
	suiteDate   = "20150830T123600Z"
)

type sigCase struct {
	name    string
	method  string
	path    string // with the query, as on the request line
	headers [][2]string
	body    string
	creq    string // the canonical request; "" when not published with the case here
	stsHash string // the last line of the string to sign
	sig     string
}

var sigV4Suite = []sigCase{
	{
		name: "get-vanilla", method: "GET", path: "/",
		creq: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63",
		sig:     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
	},
	{
		name: "get-vanilla-query-order-key-case", method: "GET", path: "/?Param2=value2&Param1=value1",
		creq: "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0",
		sig:     "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
	},
	{
		name: "get-vanilla-empty-query-key", method: "GET", path: "/?Param1=value1",
		creq: "GET\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "1e24db194ed7d0eec2de28d7369675a243488e08526e8c1c73571282f7c517ab",
		sig:     "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb",
	},
	{
		name: "get-vanilla-query-unreserved", method: "GET",
		path: "/?-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
		creq: "GET\n/\n-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n" +
			"host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "c30d4703d9f799439be92736156d47ccfb2d879ddf56f5befa6d1d6aab979177",
		sig:     "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197",
	},
	{
		name: "get-vanilla-utf8-query", method: "GET", path: "/?ሴ=bar",
		creq: "GET\n/\n%E1%88%B4=bar\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "eb30c5bed55734080471a834cc727ae56beb50e5f39d1bff6d0d38cb192a7073",
		sig:     "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04",
	},
	{
		name: "get-utf8", method: "GET", path: "/ሴ",
		creq: "GET\n/%E1%88%B4\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sig: "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85",
	},
	{
		name: "get-header-value-trim", method: "GET", path: "/",
		headers: [][2]string{{"My-Header1", " value1"}, {"My-Header2", ` "a   b   c"`}},
		creq: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\nx-amz-date:20150830T123600Z\n\n" +
			"host;my-header1;my-header2;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "a726db9b0df21c14f559d0a978e563112acb1b9e05476f0a6a1c7d68f28605c7",
		sig:     "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
	},
	{
		name: "get-header-key-duplicate", method: "GET", path: "/",
		headers: [][2]string{{"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}},
		creq: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value2,value2,value1\nx-amz-date:20150830T123600Z\n\n" +
			"host;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sig: "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea",
	},
	{
		name: "get-header-value-order", method: "GET", path: "/",
		headers: [][2]string{{"My-Header1", "value4"}, {"My-Header1", "value1"}, {"My-Header1", "value3"}, {"My-Header1", "value2"}},
		creq: "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value4,value1,value3,value2\nx-amz-date:20150830T123600Z\n\n" +
			"host;my-header1;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sig: "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01",
	},
	{
		name: "post-vanilla", method: "POST", path: "/",
		creq: "POST\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		stsHash: "553f88c9e4d10fc9e109e2aeb65f030801b70c2f6468faca261d401ae622fc87",
		sig:     "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
	},
	{
		name: "post-vanilla-query", method: "POST", path: "/?Param1=value1",
		creq: "POST\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sig: "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11",
	},
	{
		// Header names are case-insensitive: the same signature as
		// post-vanilla.
		name: "post-header-key-case", method: "POST", path: "/",
		sig: "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
	},
	{
		name: "post-header-key-sort", method: "POST", path: "/",
		headers: [][2]string{{"My-Header1", "value1"}},
		creq: "POST\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sig: "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c",
	},
	{
		name: "post-header-value-case", method: "POST", path: "/",
		headers: [][2]string{{"My-Header1", "VALUE1"}},
		creq: "POST\n/\n\nhost:example.amazonaws.com\nmy-header1:VALUE1\nx-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sig: "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d",
	},
	{
		name: "post-x-www-form-urlencoded", method: "POST", path: "/",
		headers: [][2]string{{"Content-Type", "application/x-www-form-urlencoded"}},
		body:    "Param1=value1",
		creq: "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n" +
			"content-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
		stsHash: "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281",
		sig:     "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a",
	},
	{
		name: "post-x-www-form-urlencoded-parameters", method: "POST", path: "/",
		headers: [][2]string{{"Content-Type", "application/x-www-form-urlencoded; charset=utf8"}},
		body:    "Param1=value1",
		creq: "POST\n/\n\ncontent-type:application/x-www-form-urlencoded; charset=utf8\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n" +
			"content-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
		stsHash: "2e1cf7ed91881a30569e46552437e4156c823447bf1781b921b5d486c568dd1c",
		sig:     "1a72ec8f64bd914b0e42e42607c7fbce7fb2c7465f63e3092b3b0d39fa77a6fe",
	},
}

func suiteRequest(t *testing.T, host string, c sigCase) *http.Request {
	t.Helper()
	req, err := http.NewRequest(c.method, "https://"+host+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range c.headers {
		req.Header.Add(h[0], h[1])
	}
	return req
}

func TestSigV4TestSuite(t *testing.T) {
	t.Parallel()
	at, _ := time.Parse("20060102T150405Z", suiteDate)
	s := sigV4Signer{creds: s3Credentials{AccessKeyID: suiteKey, Secret: suiteSecret}, region: "us-east-1", service: "service"}
	for _, c := range sigV4Suite {
		t.Run(c.name, func(t *testing.T) {
			req := suiteRequest(t, "example.amazonaws.com", c)
			res := s.sign(req, hexSHA256([]byte(c.body)), at)
			if c.creq != "" && res.CanonicalRequest != c.creq {
				t.Errorf("canonical request:\n%s\nwant:\n%s", res.CanonicalRequest, c.creq)
			}
			wantSTS := "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
			if !strings.HasPrefix(res.StringToSign, wantSTS) {
				t.Errorf("string to sign:\n%s", res.StringToSign)
			}
			if c.stsHash != "" && res.StringToSign != wantSTS+c.stsHash {
				t.Errorf("string to sign:\n%s\nwant:\n%s", res.StringToSign, wantSTS+c.stsHash)
			}
			signed := "host;x-amz-date"
			if c.creq != "" {
				lines := strings.Split(c.creq, "\n")
				signed = lines[len(lines)-2]
			}
			want := "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=" +
				signed + ", Signature=" + c.sig
			if res.Authorization != want {
				t.Errorf("authorization:\n%s\nwant:\n%s", res.Authorization, want)
			}
			if got := req.Header.Get("Authorization"); got != res.Authorization {
				t.Errorf("header not set: %q", got)
			}
		})
	}
}

// The worked examples of the S3 documentation ("Signature Calculations for
// the Authorization Header: Transferring Payload in a Single Chunk"), with
// their example credentials, bucket and date. These sign
// x-amz-content-sha256 as S3 requires.
func TestSigV4S3Examples(t *testing.T) {
	t.Parallel()
	at, _ := time.Parse("20060102T150405Z", "20130524T000000Z")
	s := sigV4Signer{creds: s3Credentials{AccessKeyID: "AKIAIOSFODNN7EXAMPLE", Secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
		region: "us-east-1", service: "s3"}
	cases := []struct {
		name, method, path, body string
		headers                  [][2]string
		creq, stsHash, signed    string
		sig                      string
	}{
		{
			name: "GET Object", method: "GET", path: "/test.txt", headers: [][2]string{{"Range", "bytes=0-9"}},
			creq: "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n" +
				"x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\n" +
				"host;range;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
			stsHash: "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
			signed:  "host;range;x-amz-content-sha256;x-amz-date",
			sig:     "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
		},
		{
			name: "PUT Object", method: "PUT", path: "/test$file.text", body: "Welcome to Amazon S3.",
			headers: [][2]string{{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"X-Amz-Storage-Class", "REDUCED_REDUNDANCY"}},
			creq: "PUT\n/test%24file.text\n\ndate:Fri, 24 May 2013 00:00:00 GMT\nhost:examplebucket.s3.amazonaws.com\n" +
				"x-amz-content-sha256:44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\nx-amz-date:20130524T000000Z\n" +
				"x-amz-storage-class:REDUCED_REDUNDANCY\n\ndate;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n" +
				"44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
			stsHash: "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d",
			signed:  "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
			sig:     "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd",
		},
		{
			name: "GET Bucket Lifecycle", method: "GET", path: "/?lifecycle",
			creq: "GET\n/\nlifecycle=\nhost:examplebucket.s3.amazonaws.com\n" +
				"x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\n" +
				"host;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
			stsHash: "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca",
			signed:  "host;x-amz-content-sha256;x-amz-date",
			sig:     "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543",
		},
		{
			name: "Get Bucket (List Objects)", method: "GET", path: "/?max-keys=2&prefix=J",
			creq: "GET\n/\nmax-keys=2&prefix=J\nhost:examplebucket.s3.amazonaws.com\n" +
				"x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\n" +
				"host;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
			stsHash: "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7",
			signed:  "host;x-amz-content-sha256;x-amz-date",
			sig:     "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, "https://examplebucket.s3.amazonaws.com"+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range c.headers {
				req.Header.Add(h[0], h[1])
			}
			hash := hexSHA256([]byte(c.body))
			req.Header.Set("X-Amz-Content-Sha256", hash)
			res := s.sign(req, hash, at)
			if res.CanonicalRequest != c.creq {
				t.Errorf("canonical request:\n%s\nwant:\n%s", res.CanonicalRequest, c.creq)
			}
			sts := "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n" + c.stsHash
			if res.StringToSign != sts {
				t.Errorf("string to sign:\n%s\nwant:\n%s", res.StringToSign, sts)
			}
			want := "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=" +
				c.signed + ",Signature=" + c.sig
			// The S3 document writes the header without spaces after the
			// commas; both forms are accepted, and this signer writes the
			// test suite's.
			if strings.ReplaceAll(res.Authorization, ", ", ",") != want {
				t.Errorf("authorization:\n%s\nwant:\n%s", res.Authorization, want)
			}
			if c.name == "PUT Object" && req.URL.EscapedPath() != "/test%24file.text" {
				t.Errorf("the request would be sent as %s, not as signed", req.URL.EscapedPath())
			}
		})
	}
}

// The signing-key derivation example of the SigV4 documentation, and the
// IAM ListUsers request it signs.
func TestSigV4SigningKey(t *testing.T) {
	t.Parallel()
	k := sigV4Key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam")
	if got := hex.EncodeToString(k); got != "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d" {
		t.Fatalf("signing key %s", got)
	}
	at, _ := time.Parse("20060102T150405Z", suiteDate)
	s := sigV4Signer{creds: s3Credentials{AccessKeyID: suiteKey, Secret: suiteSecret}, region: "us-east-1", service: "iam"}
	req, _ := http.NewRequest("GET", "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08", nil)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	res := s.sign(req, emptySHA256, at)
	if got := hexSHA256([]byte(res.CanonicalRequest)); got != "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59" {
		t.Errorf("canonical request hash %s:\n%s", got, res.CanonicalRequest)
	}
	if !strings.HasSuffix(res.Authorization, "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7") {
		t.Errorf("authorization %s", res.Authorization)
	}
}

// A session token is signed (it is set before the headers are read).
func TestSigV4SessionToken(t *testing.T) {
	t.Parallel()
	s := sigV4Signer{creds: s3Credentials{AccessKeyID: "AK", Secret: "sssssssss", SessionToken: "tok/en+=="}, region: "eu-west-1", service: "s3"}
	req, _ := http.NewRequest("GET", "https://b.s3.eu-west-1.amazonaws.com/k", nil)
	req.Header.Set("X-Amz-Content-Sha256", emptySHA256)
	res := s.sign(req, emptySHA256, time.Now())
	if req.Header.Get("X-Amz-Security-Token") != "tok/en+==" || !strings.Contains(res.CanonicalRequest, "x-amz-security-token:tok/en+==\n") ||
		!strings.Contains(res.Authorization, "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token,") {
		t.Fatalf("token not signed:\n%s\n%s", res.CanonicalRequest, res.Authorization)
	}
}

// Keys are encoded once per segment, query values the SigV4 way (space as
// %20, '+' kept literal), and what is sent is what was signed.
func TestSigV4Encoding(t *testing.T) {
	t.Parallel()
	if got := uriEncode("a b+c/ä~*", true); got != "a%20b%2Bc/%C3%A4~%2A" {
		t.Errorf("uriEncode: %s", got)
	}
	if got := uriEncode("a/b", false); got != "a%2Fb" {
		t.Errorf("uriEncode without slash: %s", got)
	}
	if got := canonicalQuery("b=2&a=x+y&uploads&a=%41"); got != "a=A&a=x%2By&b=2&uploads=" {
		t.Errorf("canonicalQuery: %s", got)
	}
	c := mustClient(t, S3Config{Endpoint: "http://127.0.0.1:9000", Bucket: "bk"}, nil)
	u := c.objectURL("dir/a b$(1)+ä.db", url.Values{"prefix": {"x y"}})
	req, _ := http.NewRequest("GET", u.String(), nil)
	req.URL = u
	res := c.signer.sign(req, emptySHA256, time.Now())
	if lines := strings.Split(res.CanonicalRequest, "\n"); lines[1] != "/bk/dir/a%20b%24%281%29%2B%C3%A4.db" || lines[2] != "prefix=x%20y" {
		t.Fatalf("canonical uri/query: %q %q", lines[1], lines[2])
	}
	if req.URL.EscapedPath() != "/bk/dir/a%20b%24%281%29%2B%C3%A4.db" || req.URL.RawQuery != "prefix=x%20y" {
		t.Fatalf("sent as %s?%s", req.URL.EscapedPath(), req.URL.RawQuery)
	}
}

// ---------------------------------------------------------------------------
// Addressing and configuration

func mustClient(t *testing.T, cfg S3Config, hc *http.Client) *S3Client {
	t.Helper()
	if cfg.Creds.AccessKeyID == "" {
		cfg.Creds = s3Credentials{AccessKeyID: "AKTEST", Secret: "test-secret-value"}
	}
	c, err := NewS3Client(cfg, hc, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestS3Addressing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		cfg  S3Config
		key  string
		want string
	}{
		// AWS: virtual-hosted unless the bucket name cannot be a host label.
		{S3Config{Region: "eu-west-1", Bucket: "my-bucket"}, "backups/a.db.gz", "https://my-bucket.s3.eu-west-1.amazonaws.com/backups/a.db.gz"},
		{S3Config{Bucket: "my-bucket"}, "", "https://my-bucket.s3.us-east-1.amazonaws.com/"},
		{S3Config{Region: "eu-west-1", Bucket: "my.dotted.bucket"}, "k", "https://s3.eu-west-1.amazonaws.com/my.dotted.bucket/k"},
		{S3Config{Region: "eu-west-1", Bucket: "my-bucket", Addressing: "path"}, "k", "https://s3.eu-west-1.amazonaws.com/my-bucket/k"},
		// Custom endpoints: path-style unless asked.
		{S3Config{Endpoint: "http://minio:9000", Bucket: "q"}, "k", "http://minio:9000/q/k"},
		{S3Config{Endpoint: "http://minio:9000", Bucket: "q"}, "", "http://minio:9000/q"},
		{S3Config{Endpoint: "https://acct.r2.cloudflarestorage.com/", Region: "auto", Bucket: "q"}, "k", "https://acct.r2.cloudflarestorage.com/q/k"},
		{S3Config{Endpoint: "s3.us-west-004.backblazeb2.com", Region: "us-west-004", Bucket: "q-b2", Addressing: "virtual"}, "k", "https://q-b2.s3.us-west-004.backblazeb2.com/k"},
		{S3Config{Endpoint: "http://garage:3900/s3/", Bucket: "q"}, "k", "http://garage:3900/s3/q/k"},
	}
	for _, c := range cases {
		cl := mustClient(t, c.cfg, nil)
		if got := cl.objectURL(c.key, nil).String(); got != c.want {
			t.Errorf("%+v %q: %s, want %s", c.cfg, c.key, got, c.want)
		}
	}
	for _, bad := range []S3Config{
		{Endpoint: "ftp://x", Bucket: "b"},
		{Endpoint: "http://user:pw@host", Bucket: "b"},
		{Bucket: "Bad_Name", Addressing: "virtual"},
		{Bucket: "b", Addressing: "sideways"},
	} {
		bad.Creds = s3Credentials{AccessKeyID: "a", Secret: "b"}
		if _, err := NewS3Client(bad, nil, nil); err == nil {
			t.Errorf("accepted %+v", bad)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("error shows the URL's password: %v", err)
		}
	}
	if _, err := NewS3Client(S3Config{Bucket: "b"}, nil, nil); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("missing credentials: %v", err)
	}
}

// Virtual-hosted requests reach the bucket's host name and are signed for
// it; a dialer stands in for the wildcard DNS a real service has.
func TestS3VirtualHostedRequests(t *testing.T) {
	t.Parallel()
	fake := newFakeS3("vbucket")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	_, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, ts.Listener.Addr().String())
	}}}
	c := mustClient(t, S3Config{Endpoint: "http://s3.test:" + port, Bucket: "vbucket", Addressing: "virtual"}, hc)
	if err := c.PutObject(t.Context(), "a/b.txt", bytesPayload([]byte("hello")), nil); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(t.Context(), "a/")
	if err != nil || len(list) != 1 || list[0].Key != "a/b.txt" {
		t.Fatalf("list: %v %+v", err, list)
	}
	hosts := fake.hosts()
	if len(hosts) == 0 || slices.ContainsFunc(hosts, func(h string) bool { return h != "vbucket.s3.test:"+port }) {
		t.Fatalf("hosts seen: %v", hosts)
	}
}

// Credentials print as [redacted] whatever the formatter.
func TestS3CredentialsRedacted(t *testing.T) {
	t.Parallel()
	const sec = "SUPER-SECRET-KEY-123"
	creds := s3Credentials{AccessKeyID: "AKID", Secret: sec, SessionToken: sec + "-token"}
	cfg := S3Config{Bucket: "b", Creds: creds}
	var logBuf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logBuf, nil))
	log.Info("cfg", "cfg", cfg, "creds", creds, "secret", creds.Secret)
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("cfg", "creds", creds, "secret", creds.Secret)
	j, _ := json.Marshal(creds)
	out := fmt.Sprintf("%v %+v %#v %s %q %x", creds, cfg, creds, creds.Secret, creds.Secret, creds.Secret) + logBuf.String() + string(j)
	if strings.Contains(out, sec) {
		t.Fatalf("secret printed:\n%s", out)
	}
	// A service that echoes the secret in an error message is scrubbed.
	c := mustClient(t, S3Config{Endpoint: "http://x", Bucket: "b", Creds: creds}, nil)
	if got := c.scrub("bad key " + sec); strings.Contains(got, sec) {
		t.Fatalf("scrub: %s", got)
	}
}

// ---------------------------------------------------------------------------
// Client behaviour against an in-process fake (failures on demand)

func TestS3RetriesTransientFailures(t *testing.T) {
	t.Parallel()
	fake := newFakeS3("b")
	ts := httptest.NewServer(fake)
	defer ts.Close()
	c := mustClient(t, S3Config{Endpoint: ts.URL, Bucket: "b"}, nil)
	c.retryBase = time.Millisecond
	fake.failNext(2, http.StatusServiceUnavailable, "SlowDown")
	if err := c.PutObject(t.Context(), "k", bytesPayload([]byte("v")), map[string]string{"X": "1"}); err != nil {
		t.Fatalf("after two 503s: %v", err)
	}
	// A refusal is not retried.
	fake.failNext(1, http.StatusForbidden, "AccessDenied")
	n := fake.requests()
	err := c.PutObject(t.Context(), "k2", bytesPayload([]byte("v")), nil)
	var se *S3Error
	if !errorsAs(err, &se) || se.Code != "AccessDenied" || fake.requests()-n != 1 {
		t.Fatalf("403: %v after %d requests", err, fake.requests()-n)
	}
	// Past the attempts, the last error is returned.
	fake.failNext(10, http.StatusInternalServerError, "InternalError")
	if err := c.PutObject(t.Context(), "k3", bytesPayload([]byte("v")), nil); err == nil || !strings.Contains(err.Error(), "InternalError") {
		t.Fatalf("persistent 500: %v", err)
	}
	fake.failNext(0, 0, "")
	// The payload hash is checked by the fake, as by S3: a retried body is
	// the same body.
	body, hdr, err := c.GetObject(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(body)
	body.Close()
	if string(b) != "v" || hdr.Get("X-Amz-Meta-X") != "1" {
		t.Fatalf("got %q %v", b, hdr)
	}
	if _, _, err := c.GetObject(t.Context(), "missing"); !isS3NotFound(err) {
		t.Fatalf("missing key: %v", err)
	}
	if err := c.DeleteObject(t.Context(), "missing"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
}

// Multipart upload: parts, completion, an error inside a 200 answer, and
// the abort after a failed part.
func TestS3Multipart(t *testing.T) {
	t.Parallel()
	fake := newFakeS3("b")
	fake.pageSize = 2
	ts := httptest.NewServer(fake)
	defer ts.Close()
	c := mustClient(t, S3Config{Endpoint: ts.URL, Bucket: "b"}, nil)
	c.retryBase = time.Millisecond
	c.partSize = 1 << 20
	data := make([]byte, 3<<20+12345)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "big")
	os.WriteFile(path, data, 0o644)
	if err := c.UploadFile(t.Context(), "big", path, map[string]string{"Sha256": hexSHA256(data)}); err != nil {
		t.Fatal(err)
	}
	if got := fake.object("big"); !bytes.Equal(got, data) {
		t.Fatalf("object is %d bytes, want %d", len(got), len(data))
	}
	if parts := fake.count("PUT", "partNumber"); parts != 4 {
		t.Fatalf("%d parts uploaded, want 4", parts)
	}
	if m := fake.meta("big").Get("X-Amz-Meta-Sha256"); m != hexSHA256(data) {
		t.Fatalf("metadata %q", m)
	}
	// A part that keeps failing aborts the upload.
	fake.failWhen(func(r *http.Request) bool { return r.URL.Query().Get("partNumber") == "3" })
	if err := c.UploadFile(t.Context(), "big2", path, nil); err == nil {
		t.Fatal("upload with a failing part succeeded")
	}
	if fake.count("DELETE", "uploadId") != 1 || fake.pendingUploads() != 0 || fake.object("big2") != nil {
		t.Fatalf("failed upload not aborted: %d aborts, %d pending", fake.count("DELETE", "uploadId"), fake.pendingUploads())
	}
	fake.failWhen(nil)
	// The service can fail the completion in a 200 answer.
	fake.completeError = "InternalError"
	if err := c.UploadFile(t.Context(), "big3", path, nil); err == nil || !strings.Contains(err.Error(), "InternalError") {
		t.Fatalf("error in a 200 completion: %v", err)
	}
	fake.completeError = ""
	// Listing pages through continuation tokens.
	for i := range 5 {
		c.PutObject(t.Context(), fmt.Sprintf("p/%d", i), bytesPayload(nil), nil)
	}
	list, err := c.List(t.Context(), "p/")
	if err != nil || len(list) != 5 {
		t.Fatalf("list over pages: %v %d", err, len(list))
	}
}

func errorsAs(err error, target **S3Error) bool {
	for err != nil {
		if se, ok := err.(*S3Error); ok {
			*target = se
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// ---------------------------------------------------------------------------
// fakeS3: an in-memory S3 for the failure tests. It checks that each
// request is signed and that the payload matches x-amz-content-sha256 (as
// S3 does), but not the signature itself: s3rver does that in the
// end-to-end tests.

type fakeS3 struct {
	bucket   string
	pageSize int

	mu            sync.Mutex
	objs          map[string]fakeObject
	uploads       map[string]map[int][]byte
	uploadMeta    map[string]http.Header
	log           []string // "METHOD query-keys"
	hostsSeen     []string
	failCount     int
	failStatus    int
	failCode      string
	failIf        func(*http.Request) bool
	completeError string
	hold          chan struct{} // when set, PUTs wait for it to close
	nextID        int
}

type fakeObject struct {
	data []byte
	meta http.Header
	at   time.Time
}

func newFakeS3(bucket string) *fakeS3 {
	return &fakeS3{bucket: bucket, pageSize: 1000, objs: map[string]fakeObject{}, uploads: map[string]map[int][]byte{},
		uploadMeta: map[string]http.Header{}}
}

func (f *fakeS3) failNext(n, status int, code string) {
	f.mu.Lock()
	f.failCount, f.failStatus, f.failCode = n, status, code
	f.mu.Unlock()
}

func (f *fakeS3) failWhen(cond func(*http.Request) bool) {
	f.mu.Lock()
	f.failIf = cond
	f.mu.Unlock()
}

func (f *fakeS3) requests() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.log) }
func (f *fakeS3) hosts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.hostsSeen)
}
func (f *fakeS3) object(k string) []byte { f.mu.Lock(); defer f.mu.Unlock(); return f.objs[k].data }
func (f *fakeS3) meta(k string) http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objs[k].meta
}
func (f *fakeS3) pendingUploads() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.uploads) }
func (f *fakeS3) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.objs))
}

// count counts the requests with a method and a query parameter.
func (f *fakeS3) count(method, param string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.log {
		m, q, _ := strings.Cut(l, " ")
		if m == method && slices.Contains(strings.Split(q, ","), param) {
			n++
		}
	}
	return n
}

func (f *fakeS3) corrupt(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.objs[key]
	o.data = slices.Clone(o.data)
	o.data[len(o.data)/2] ^= 0xff
	f.objs[key] = o
}

func s3ErrorXML(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>%s happened</Message><RequestId>fake</RequestId></Error>`, code, code)
}

func (f *fakeS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	q := r.URL.Query()
	f.mu.Lock()
	f.log = append(f.log, r.Method+" "+strings.Join(slices.Sorted(maps.Keys(q)), ","))
	f.hostsSeen = append(f.hostsSeen, r.Host)
	hold := f.hold
	fail := f.failCount > 0 || (f.failIf != nil && f.failIf(r))
	status, code := f.failStatus, f.failCode
	if f.failCount > 0 {
		f.failCount--
	} else if fail {
		status, code = http.StatusInternalServerError, "InternalError"
	}
	f.mu.Unlock()
	if hold != nil && r.Method == "PUT" {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if fail {
		s3ErrorXML(w, status, code)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=") || r.Header.Get("X-Amz-Date") == "" {
		s3ErrorXML(w, http.StatusForbidden, "AccessDenied")
		return
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != r.Header.Get("X-Amz-Content-Sha256") {
		s3ErrorXML(w, http.StatusBadRequest, "XAmzContentSHA256Mismatch")
		return
	}
	// Path-style /bucket/key, or virtual-hosted bucket.host/key.
	path := r.URL.Path
	if h, _, _ := strings.Cut(r.Host, "."); h == f.bucket && strings.Contains(r.Host, ".") {
		path = "/" + f.bucket + path
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if bucket != f.bucket {
		s3ErrorXML(w, http.StatusNotFound, "NoSuchBucket")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == "GET" && key == "" && q.Get("list-type") == "2":
		var keys []string
		for k := range f.objs {
			if strings.HasPrefix(k, q.Get("prefix")) && k > q.Get("continuation-token") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		type content struct {
			Key          string
			Size         int
			LastModified string
		}
		res := struct {
			XMLName     xml.Name `xml:"ListBucketResult"`
			IsTruncated bool
			NextToken   string `xml:"NextContinuationToken,omitempty"`
			Contents    []content
		}{}
		if len(keys) > f.pageSize {
			keys, res.IsTruncated = keys[:f.pageSize], true
			res.NextToken = keys[len(keys)-1]
		}
		for _, k := range keys {
			res.Contents = append(res.Contents, content{k, len(f.objs[k].data), f.objs[k].at.UTC().Format(time.RFC3339)})
		}
		xml.NewEncoder(w).Encode(res)
	case r.Method == "POST" && q.Has("uploads"):
		f.nextID++
		id := "up" + strconv.Itoa(f.nextID)
		f.uploads[id] = map[int][]byte{}
		f.uploadMeta[id] = metaOf(r.Header)
		fmt.Fprintf(w, `<InitiateMultipartUploadResult><Bucket>%s</Bucket><Key>%s</Key><UploadId>%s</UploadId></InitiateMultipartUploadResult>`, bucket, key, id)
	case r.Method == "PUT" && q.Has("uploadId"):
		parts := f.uploads[q.Get("uploadId")]
		if parts == nil {
			s3ErrorXML(w, http.StatusNotFound, "NoSuchUpload")
			return
		}
		n, _ := strconv.Atoi(q.Get("partNumber"))
		parts[n] = body
		w.Header().Set("ETag", `"`+hexSHA256(body)[:32]+`"`)
	case r.Method == "POST" && q.Has("uploadId"):
		id := q.Get("uploadId")
		parts := f.uploads[id]
		if parts == nil {
			s3ErrorXML(w, http.StatusNotFound, "NoSuchUpload")
			return
		}
		if f.completeError != "" {
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>completion failed</Message></Error>`, f.completeError)
			return
		}
		var doc struct {
			Parts []completedPart `xml:"Part"`
		}
		xml.Unmarshal(body, &doc)
		var data []byte
		for i, p := range doc.Parts {
			if p.PartNumber != i+1 || p.ETag != `"`+hexSHA256(parts[p.PartNumber])[:32]+`"` {
				s3ErrorXML(w, http.StatusBadRequest, "InvalidPart")
				return
			}
			data = append(data, parts[p.PartNumber]...)
		}
		f.objs[key] = fakeObject{data: data, meta: f.uploadMeta[id], at: time.Now()}
		delete(f.uploads, id)
		fmt.Fprintf(w, `<CompleteMultipartUploadResult><Key>%s</Key></CompleteMultipartUploadResult>`, key)
	case r.Method == "DELETE" && q.Has("uploadId"):
		delete(f.uploads, q.Get("uploadId"))
		w.WriteHeader(http.StatusNoContent)
	case r.Method == "PUT":
		f.objs[key] = fakeObject{data: body, meta: metaOf(r.Header), at: time.Now()}
		w.Header().Set("ETag", `"x"`)
	case r.Method == "GET":
		o, ok := f.objs[key]
		if !ok {
			s3ErrorXML(w, http.StatusNotFound, "NoSuchKey")
			return
		}
		for k, v := range o.meta {
			w.Header()[k] = v
		}
		w.Write(o.data)
	case r.Method == "DELETE":
		delete(f.objs, key)
		w.WriteHeader(http.StatusNoContent)
	default:
		s3ErrorXML(w, http.StatusNotImplemented, "NotImplemented")
	}
}

func metaOf(h http.Header) http.Header {
	m := http.Header{}
	for k, v := range h {
		if strings.HasPrefix(k, "X-Amz-Meta-") {
			m[k] = v
		}
	}
	return m
}

// ---------------------------------------------------------------------------
// Against a real S3-compatible server that checks signatures

// s3rverCreds are the keys s3rver's one account has.
var s3rverCreds = s3Credentials{AccessKeyID: "S3RVER", Secret: "S3RVER"}

// startS3rver runs compat/s3rver.cjs (the @20minutes/s3rver package) with
// the given buckets and returns its endpoint. Without the package the test
// is skipped with the install command, and fails under CI=true.
func startS3rver(t testing.TB, buckets ...string) string {
	t.Helper()
	dir, _ := filepath.Abs("compat")
	missing := func(what string) {
		needService(t, what+" missing (s3rver)", "(cd compat && npm ci)")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@20minutes", "s3rver")); err != nil {
		missing("compat/node_modules/@20minutes/s3rver")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node")
	}
	cmd := exec.Command(node, append([]string{"s3rver.cjs", t.TempDir()}, buckets...)...)
	cmd.Dir = dir
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &lockedWriter{&sync.Mutex{}, &stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		stdin.Close() // the script exits when its input ends
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	ready := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m struct{ Port int }
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Port > 0 {
				ready <- m.Port
			}
		}
	}()
	go func() { cmd.Wait(); close(exited) }()
	select {
	case port := <-ready:
		return fmt.Sprintf("http://127.0.0.1:%d", port)
	case <-exited:
		t.Fatalf("s3rver exited:\n%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("s3rver did not start:\n%s", stderr.String())
	}
	return ""
}

// TestS3rverChecksSignatures first proves the server refuses a request
// signed with a wrong secret (otherwise the tests against it would prove
// nothing about the signer), then runs every operation the backups use,
// with keys that need encoding, and a multipart upload.
func TestS3rverChecksSignatures(t *testing.T) {
	t.Parallel()
	ep := startS3rver(t, "sigcheck")
	ctx := t.Context()
	wrong := mustClient(t, S3Config{Endpoint: ep, Bucket: "sigcheck", Creds: s3Credentials{AccessKeyID: "S3RVER", Secret: "not-the-secret"}}, nil)
	err := wrong.PutObject(ctx, "x", bytesPayload([]byte("x")), nil)
	var se *S3Error
	if !errorsAs(err, &se) || se.Code != "SignatureDoesNotMatch" || se.Status != http.StatusForbidden {
		t.Fatalf("s3rver accepted (or refused oddly) a wrong secret: %v", err)
	}
	if strings.Contains(err.Error(), "not-the-secret") {
		t.Fatalf("error shows the secret: %v", err)
	}
	if _, err := wrong.List(ctx, ""); !errorsAs(err, &se) || se.Code != "SignatureDoesNotMatch" {
		t.Fatalf("list with a wrong secret: %v", err)
	}
	unknown := mustClient(t, S3Config{Endpoint: ep, Bucket: "sigcheck", Creds: s3Credentials{AccessKeyID: "NOBODY", Secret: "S3RVER"}}, nil)
	if err := unknown.PutObject(ctx, "x", bytesPayload([]byte("x")), nil); !errorsAs(err, &se) || se.Code != "InvalidAccessKeyId" {
		t.Fatalf("unknown access key: %v", err)
	}

	c := mustClient(t, S3Config{Endpoint: ep, Bucket: "sigcheck", Creds: s3rverCreds}, nil)
	keys := []string{"plain.txt", "dir/with space+plus$(x)!'*.gz", "ünï/cødé.db", "a~b_c-d.e"}
	for i, k := range keys {
		data := bytes.Repeat([]byte{byte('a' + i)}, 1000+i)
		if err := c.PutObject(ctx, k, bytesPayload(data), map[string]string{"Sha256": hexSHA256(data)}); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
		body, hdr, err := c.GetObject(ctx, k)
		if err != nil {
			t.Fatalf("get %q: %v", k, err)
		}
		got, _ := io.ReadAll(body)
		body.Close()
		if !bytes.Equal(got, data) || hdr.Get("X-Amz-Meta-Sha256") != hexSHA256(data) {
			t.Fatalf("get %q: %d bytes, metadata %v", k, len(got), hdr)
		}
	}
	list, err := c.List(ctx, "")
	if err != nil || len(list) != len(keys) {
		t.Fatalf("list: %v %+v", err, list)
	}
	if list, err := c.List(ctx, "dir/with space"); err != nil || len(list) != 1 {
		t.Fatalf("list with an encoded prefix: %v %+v", err, list)
	}
	for _, k := range keys {
		if err := c.DeleteObject(ctx, k); err != nil {
			t.Fatalf("delete %q: %v", k, err)
		}
	}
	if list, _ := c.List(ctx, ""); len(list) != 0 {
		t.Fatalf("left after delete: %+v", list)
	}

	// Multipart, with S3's smallest part size.
	c.partSize = minPartSize
	data := make([]byte, 2*minPartSize+4321)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "big.bin")
	os.WriteFile(path, data, 0o644)
	if err := c.UploadFile(ctx, "multi/big.bin", path, map[string]string{"Sha256": hexSHA256(data)}); err != nil {
		t.Fatalf("multipart: %v", err)
	}
	body, hdr, err := c.GetObject(ctx, "multi/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(body)
	body.Close()
	if !bytes.Equal(got, data) || hdr.Get("X-Amz-Meta-Sha256") != hexSHA256(data) {
		t.Fatalf("multipart object: %d bytes (want %d), metadata %q", len(got), len(data), hdr.Get("X-Amz-Meta-Sha256"))
	}
	// A multipart upload signed wrongly fails at its first request.
	wrong.partSize = minPartSize
	if err := wrong.UploadFile(ctx, "multi/bad.bin", path, nil); !errorsAs(err, &se) || se.Code != "SignatureDoesNotMatch" {
		t.Fatalf("multipart with a wrong secret: %v", err)
	}
}
