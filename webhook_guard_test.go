package main

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// The address ranges that are someone's inside but were let through:
// NAT64, 6to4 and Teredo addresses of an inside IPv4 address, shared
// (CGNAT) and benchmarking space, and the other special-purpose ranges.
// Each is refused on connection and, written as a literal, at
// registration; the same forms around a public IPv4 address stay allowed.
func TestWebhookGuardSpecialRanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ addr, why string }{
		// IPv4 special-purpose space.
		{"100.64.0.1", "shared (CGNAT)"},
		{"100.127.255.254", "shared (CGNAT)"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.255", "benchmarking"},
		{"0.0.0.0", "unspecified"},
		{"0.255.1.2", "unspecified"},
		{"240.0.0.1", "reserved"},
		{"254.1.2.3", "reserved"},
		{"255.255.255.255", "broadcast"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"192.0.0.170", "special-purpose"},
		{"192.0.2.10", "documentation"},
		{"198.51.100.7", "documentation"},
		{"203.0.113.9", "documentation"},
		// IPv4 inside IPv6: mapped, compatible, translated.
		{"::ffff:100.64.0.1", "shared (CGNAT)"},
		{"::ffff:198.18.0.1", "benchmarking"},
		{"::10.0.0.1", "private"},
		{"::ffff:0:10.0.0.1", "IPv4-translated (embeds 10.0.0.1, private)"},
		// NAT64: the gateway forwards to the IPv4 address inside.
		{"64:ff9b::10.0.0.1", "NAT64 (embeds 10.0.0.1, private)"},
		{"64:ff9b::7f00:1", "NAT64 (embeds 127.0.0.1, loopback)"},
		{"64:ff9b::a9fe:a9fe", "NAT64 (embeds 169.254.169.254, cloud metadata)"},
		{"64:ff9b::100.64.1.1", "NAT64 (embeds 100.64.1.1, shared (CGNAT))"},
		{"64:ff9b:1::1", "local-use NAT64"},
		{"64:ff9b:1:abcd::8.8.8.8", "local-use NAT64"},
		// 6to4: 2002:AABB:CCDD::/48 is the site behind IPv4 AA.BB.CC.DD.
		{"2002:c0a8:101::1", "6to4 (embeds 192.168.1.1, private)"},
		{"2002:7f00:1::", "6to4 (embeds 127.0.0.1, loopback)"},
		{"2002:a00:1:1::5", "6to4 (embeds 10.0.0.1, private)"},
		{"2002:6440:1::1", "6to4 (embeds 100.64.0.1, shared (CGNAT))"},
		// Teredo: client IPv4 bit-inverted in the last 32 bits, server
		// IPv4 in bits 32-63.
		{"2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo (embeds 10.0.0.1, private)"},
		{"2001:0:a00:1:8000:63bf:f7f7:f7f7", "Teredo (embeds 10.0.0.1, private)"}, // server 10.0.0.1, client 8.8.8.8
		// IPv6 special-purpose space.
		{"fec0::1", "site-local"},
		{"feff::1", "site-local"},
		{"fc00::1", "private (ULA)"},
		{"fdff:ffff::1", "private (ULA)"},
		{"ff02::1", "multicast"},
		{"ff05::1:3", "multicast"},
		{"2001:db8::1", "documentation"},
		{"3fff:123::1", "documentation"},
		{"100::1", "discard-only"},
		{"2001:2::1", "benchmarking"},
	} {
		ip := netip.MustParseAddr(tc.addr)
		if got := blockedIP(ip); got != tc.why {
			t.Errorf("blockedIP(%s) = %q, want %q", tc.addr, got, tc.why)
		}
		err := guardDial("tcp", netip.AddrPortFrom(ip, 443).String(), nil)
		if !errors.Is(err, errBlockedAddr) || !strings.Contains(err.Error(), "is a "+tc.why+" address") {
			t.Errorf("dial %s: %v, want a refusal as %s", tc.addr, err, tc.why)
		}
		host := tc.addr
		if ip.Is6() {
			host = "[" + host + "]"
		}
		if err := checkWebhookURL("https://"+host+"/hook", false); err == nil ||
			!strings.HasPrefix(err.Error(), "Webhook URL cannot point to ") {
			t.Errorf("register https://%s/hook: %v, want a refusal", host, err)
		}
		if err := checkWebhookURL("https://"+host+"/hook", true); err != nil {
			t.Errorf("register https://%s/hook with private allowed: %v", host, err)
		}
	}

	// The same forms around public addresses reach public hosts: allowed.
	for _, a := range []string{
		"8.8.8.8", "100.63.255.255", "100.128.0.1", "198.17.255.255", "198.20.0.1",
		"192.0.1.1", "192.88.99.1", "223.255.255.254", "203.0.114.1",
		"64:ff9b::8.8.8.8", "64:ff9b::5db8:d822", // NAT64 of public IPv4
		"2002:808:808::1", "2002:5db8:d822:1::2", // 6to4 of 8.8.8.8, 93.184.216.34
		"2001:0:4136:e378:8000:63bf:a2b8:27dd", // Teredo, client 93.71.216.34
		"::ffff:8.8.8.8", "::8.8.8.8", "::ffff:0:8.8.8.8",
		"2606:4700::1111", "2a00:1450:4001::200e", "2001:4860:4860::8888",
	} {
		ip := netip.MustParseAddr(a)
		if why := blockedIP(ip); why != "" {
			t.Errorf("blockedIP(%s) = %q, want allowed", a, why)
		}
		if err := guardDial("tcp", netip.AddrPortFrom(ip, 443).String(), nil); err != nil {
			t.Errorf("dial %s: %v", a, err)
		}
		host := a
		if ip.Is6() {
			host = "[" + host + "]"
		}
		if err := checkWebhookURL("https://"+host+"/hook", false); err != nil {
			t.Errorf("register https://%s/hook: %v", host, err)
		}
	}

	// Registration says what the address is, in the reference's words.
	for url, want := range map[string]string{
		"http://100.64.0.1/":           "Webhook URL cannot point to shared (CGNAT) address",
		"http://198.18.0.1/":           "Webhook URL cannot point to benchmarking address",
		"http://[64:ff9b::a00:1]/":     "Webhook URL cannot point to NAT64 (embeds 10.0.0.1, private) address",
		"http://[2002:c0a8:101::1]/":   "Webhook URL cannot point to 6to4 (embeds 192.168.1.1, private) address",
		"http://100.100.100.200/":      "Webhook URL cannot point to cloud metadata endpoints",
		"http://[::ffff:100.64.0.1]/":  "Webhook URL cannot point to shared (CGNAT) address",
		"http://0x64400001/":           "Webhook URL cannot point to shared (CGNAT) address", // 100.64.0.1
		"http://[::ffff:127.0.0.1]/":   "Webhook URL cannot point to loopback IP",            // the reference's, first
		"http://[fd12::1]/":            "Webhook URL cannot point to private (ULA) IP",
		"http://255.255.255.255:8080/": "Webhook URL cannot point to broadcast address",
	} {
		if err := checkWebhookURL(url, false); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", url, err, want)
		}
	}
}
