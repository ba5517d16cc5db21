package main

// Where a webhook may send requests. A URL is checked when it is
// registered, with the reference's rules and messages, and the address is
// checked again on every connection, after name resolution (see the top
// of webhook.go for why both).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf16"
)

// ---------------------------------------------------------------------------
// The connection-time check

// dialContext resolves the host itself and dials each address through a
// dialer whose Control hook refuses inside addresses, so the address
// checked is the address connected to.
func (h *Webhooks) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("webhook address %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("webhook port %q: %w", portStr, err)
	}
	var ips []netip.Addr
	if ip, perr := netip.ParseAddr(host); perr == nil {
		ips = []netip.Addr{ip}
	} else {
		if ips, err = h.opts.lookup(ctx, host); err != nil {
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
		if len(ips) == 0 {
			return nil, fmt.Errorf("resolve %s: no addresses", host)
		}
	}
	d := net.Dialer{Timeout: webhookTimeout, KeepAlive: 30 * time.Second}
	if !h.opts.allowPrivate {
		d.Control = guardDial
	}
	var errs []error
	for _, ip := range ips {
		c, err := d.DialContext(ctx, network, netip.AddrPortFrom(ip, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// errBlockedAddr is what a refused connection wraps.
var errBlockedAddr = errors.New("webhook receiver address refused")

// guardDial is a net.Dialer Control hook: it runs after name resolution,
// just before connect(2), with the numeric address.
func guardDial(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unreadable address %q: %v", errBlockedAddr, address, err)
	}
	if why := blockedIP(ap.Addr()); why != "" {
		return fmt.Errorf("%w: %s is a %s address (start with --webhook-allow-private to allow it)", errBlockedAddr, ap.Addr(), why)
	}
	return nil
}

// Cloud metadata services. Most sit in link-local or shared (CGNAT)
// space, refused anyway; these are named so the refusal says what they
// are.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, Oracle...
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
}

// blockedRange is an address range a webhook may not reach, and what it is.
type blockedRange struct {
	p   netip.Prefix
	why string
}

func ranges(kv ...string) []blockedRange {
	out := make([]blockedRange, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		out = append(out, blockedRange{netip.MustParsePrefix(kv[i]), kv[i+1]})
	}
	return out
}

// IPv4 space that is not a public unicast host (IANA's special-purpose
// registry, less what is public: 192.88.99/24 relays are public hosts).
// Shared (CGNAT) space holds carrier and overlay networks (Tailscale, cloud
// metadata), benchmarking space lab networks: both are someone's inside.
var blockedIPv4 = ranges(
	"0.0.0.0/8", "unspecified",
	"127.0.0.0/8", "loopback",
	"10.0.0.0/8", "private",
	"172.16.0.0/12", "private",
	"192.168.0.0/16", "private",
	"169.254.0.0/16", "link-local",
	"100.64.0.0/10", "shared (CGNAT)",
	"198.18.0.0/15", "benchmarking",
	"192.0.0.0/24", "special-purpose",
	"192.0.2.0/24", "documentation",
	"198.51.100.0/24", "documentation",
	"203.0.113.0/24", "documentation",
	"224.0.0.0/4", "multicast",
	"255.255.255.255/32", "broadcast",
	"240.0.0.0/4", "reserved",
)

// IPv6 space that is not a public unicast host. Prefixes that carry an
// IPv4 address (mapped, compatible, NAT64, 6to4, Teredo) are judged by
// that address instead, in embeddedIPv4.
var blockedIPv6 = ranges(
	"::/128", "unspecified",
	"::1/128", "loopback",
	"fe80::/10", "link-local",
	"fec0::/10", "site-local",
	"fc00::/7", "private (ULA)",
	"ff00::/8", "multicast",
	"64:ff9b:1::/48", "local-use NAT64",
	"100::/64", "discard-only",
	"2001:2::/48", "benchmarking",
	"2001:db8::/32", "documentation",
	"3fff::/20", "documentation",
)

// embeddedIPv4 finds the IPv4 address an IPv6 address stands for, where
// traffic to it ends up at that IPv4 host: a NAT64 gateway (64:ff9b::/96)
// or a 6to4 relay (2002::/16) forwards to it, a Teredo address (2001::/32)
// names the client's IPv4 (bit-inverted) and its server's. kind names the
// form for the refusal; ok is false for other addresses.
func embeddedIPv4(ip netip.Addr) (kind string, v4 []netip.Addr, ok bool) {
	b := ip.As16()
	four := func(i int) netip.Addr { return netip.AddrFrom4([4]byte(b[i : i+4])) }
	zero := func(from, to int) bool {
		for _, x := range b[from:to] {
			if x != 0 {
				return false
			}
		}
		return true
	}
	switch {
	case zero(0, 12):
		// IPv4-compatible (::a.b.c.d, deprecated); :: and ::1 are
		// judged before.
		return "IPv4-compatible", []netip.Addr{four(12)}, true
	case zero(0, 8) && b[8] == 0xff && b[9] == 0xff && zero(10, 12):
		// IPv4-translated (::ffff:0:a.b.c.d, SIIT).
		return "IPv4-translated", []netip.Addr{four(12)}, true
	case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && zero(4, 12):
		return "NAT64", []netip.Addr{four(12)}, true
	case b[0] == 0x20 && b[1] == 0x02:
		return "6to4", []netip.Addr{four(2)}, true
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return "Teredo", []netip.Addr{netip.AddrFrom4(client), four(4)}, true
	}
	return "", nil, false
}

// blockedIP says why a webhook may not connect to ip ("" when it may).
func blockedIP(ip netip.Addr) string {
	ip = ip.WithZone("").Unmap()
	for _, m := range metadataAddrs {
		if ip == m {
			return "cloud metadata"
		}
	}
	if ip.Is4() {
		for _, r := range blockedIPv4 {
			if r.p.Contains(ip) {
				return r.why
			}
		}
		return ""
	}
	// :: and ::1 first: they are the exceptions to the IPv4-compatible
	// form.
	switch {
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsLoopback():
		return "loopback"
	}
	if kind, inner, ok := embeddedIPv4(ip); ok {
		for _, v4 := range inner {
			if why := blockedIP(v4); why != "" {
				if kind == "IPv4-compatible" {
					return why // as it always read
				}
				return fmt.Sprintf("%s (embeds %s, %s)", kind, v4, why)
			}
		}
		return ""
	}
	for _, r := range blockedIPv6 {
		if r.p.Contains(ip) {
			return r.why
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// The registration-time check: the reference's rules and messages

// checkWebhookURL validates a URL as AddWebhook does. With allowPrivate
// only its form is checked.
func checkWebhookURL(raw string, allowPrivate bool) error {
	if raw == "" {
		return errors.New("Webhook URL is required")
	}
	// A UTF-16 unit takes at most 3 bytes of UTF-8: a longer string is
	// too long without encoding it all.
	if len(raw) > 3*maxWebhookURL || len(utf16.Encode([]rune(raw))) > maxWebhookURL {
		return errors.New("Webhook URL too long (max 2048 characters)")
	}
	invalid := errors.New("Invalid URL format")
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return invalid
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		// An address with a scheme is a URL, if not one we send to.
		return errors.New("Webhook URL must use http or https protocol")
	}
	// http:host without slashes is a URL to WHATWG but has no host for
	// Go's client: refused as what we could never deliver to.
	if u.Host == "" || u.Hostname() == "" {
		return invalid
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n > 65535 {
			return invalid
		}
	}
	if allowPrivate {
		return nil
	}
	return checkWebhookHost(strings.ToLower(u.Hostname()))
}

func checkWebhookHost(host string) error {
	refuse := func(what string) error { return errors.New("Webhook URL cannot point to " + what) }
	if strings.Contains(host, ":") {
		ip, err := netip.ParseAddr(host)
		if err != nil || ip.Zone() != "" {
			return errors.New("Invalid URL format")
		}
		if ip == netip.IPv6Loopback() {
			return refuse("localhost")
		}
		b := ip.As16()
		if ip.Is4In6() || [12]byte(b[:12]) == ([12]byte{}) && !ip.IsUnspecified() {
			if err := checkWebhookIPv4(netip.AddrFrom4([4]byte(b[12:]))); err != nil {
				return err
			}
			return checkBlockedLiteral(ip)
		}
		first := uint16(b[0])<<8 | uint16(b[1])
		switch {
		case ip.IsUnspecified():
			return refuse("unspecified IP")
		case first&0xfe00 == 0xfc00:
			return refuse("private (ULA) IP")
		case first&0xffc0 == 0xfe80:
			return refuse("link-local IP")
		}
		return checkBlockedLiteral(ip)
	}
	ip4, isIPv4, err := whatwgIPv4(host)
	if err != nil {
		return errors.New("Invalid URL format")
	}
	if isIPv4 {
		if ip4 == netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
			return refuse("localhost")
		}
		if err := checkWebhookIPv4(ip4); err != nil {
			return err
		}
		return checkBlockedLiteral(ip4)
	}
	name := strings.TrimSuffix(host, ".")
	switch {
	case name == "localhost" || strings.HasSuffix(name, ".localhost"):
		return refuse("localhost")
	case name == "metadata.google.internal" || strings.HasSuffix(name, ".internal"):
		return refuse("cloud metadata endpoints")
	}
	return nil
}

// checkBlockedLiteral refuses, at registration, a literal address that
// passed the reference's rules but that the connection-time check would
// refuse on every delivery (NAT64, 6to4 and Teredo addresses of an inside
// IPv4, shared and benchmarking space, multicast...): better said now than
// found in the failure count later.
func checkBlockedLiteral(ip netip.Addr) error {
	switch why := blockedIP(ip); why {
	case "":
		return nil
	case "cloud metadata":
		return errors.New("Webhook URL cannot point to cloud metadata endpoints")
	default:
		return errors.New("Webhook URL cannot point to " + why + " address")
	}
}

func checkWebhookIPv4(ip netip.Addr) error {
	a := ip.As4()
	refuse := func(what string) error { return errors.New("Webhook URL cannot point to " + what) }
	switch {
	case a[0] == 10 || a[0] == 172 && a[1]&0xf0 == 16 || a[0] == 192 && a[1] == 168:
		return refuse("private IP")
	case a[0] == 169 && a[1] == 254:
		return refuse("link-local IP")
	case a[0] == 0:
		return refuse("unspecified IP")
	case a[0] == 127:
		return refuse("loopback IP")
	}
	return nil
}

// whatwgIPv4 reads host the way the WHATWG URL standard's host parser
// does: a host whose last label is a number is an IPv4 address, in any of
// the forms inet_aton took (127.1, 2130706433, 0x7f.1, 0177.0.0.1), and an
// invalid URL when it is not a valid one. isIPv4 is false for a domain.
func whatwgIPv4(host string) (ip netip.Addr, isIPv4 bool, err error) {
	parts := strings.Split(host, ".")
	if len(parts) > 1 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	last := parts[len(parts)-1]
	if _, ok := ipv4Number(last); !ok && !(last != "" && allDigits(last)) {
		return netip.Addr{}, false, nil
	}
	bad := errors.New("invalid IPv4 address")
	if len(parts) > 4 {
		return netip.Addr{}, true, bad
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, ok := ipv4Number(p)
		if !ok {
			return netip.Addr{}, true, bad
		}
		nums[i] = n
	}
	for _, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, true, bad
		}
	}
	lastN := nums[len(nums)-1]
	if lastN >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, true, bad
	}
	v := lastN
	for i, n := range nums[:len(nums)-1] {
		v += n << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true, nil
}

// ipv4Number parses one label as WHATWG's IPv4 number parser: 0x for hex,
// a leading 0 for octal, else decimal; "0x" alone is 0.
func ipv4Number(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := 10
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" {
		return 0, true
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= '0' && c <= '9' && int(c-'0') < base ||
			base == 16 && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F')
		if !ok {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		// Only overflow is left: a number this large is no IPv4 label,
		// but it is a number (the URL is then invalid).
		return 1 << 40, true
	}
	return n, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
