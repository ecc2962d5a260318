package delivery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSSRFRefusesEveryBlockedClass(t *testing.T) {
	t.Parallel()
	cases := []struct {
		addr    string
		blocked bool
	}{
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"10.0.0.1", true},
		{"10.255.255.255", true},
		{"100.64.0.1", true},
		{"100.127.255.254", true},
		{"127.0.0.1", true},
		{"127.8.9.10", true},
		{"169.254.169.254", true}, // cloud metadata
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.0.0.8", true},
		{"192.168.1.1", true},
		{"198.18.0.1", true},
		{"198.19.255.255", true},
		{"224.0.0.1", true},
		{"239.255.255.250", true},
		{"240.0.0.1", true},
		{"255.255.255.255", true},
		{"::", true},
		{"::1", true},
		{"fc00::1", true},
		{"fd12:3456::1", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"ff02::1", true},
		{"::ffff:127.0.0.1", true},
		{"::ffff:10.1.2.3", true},
		{"::ffff:169.254.169.254", true},
		{"64:ff9b::127.0.0.1", true},
		{"64:ff9b::a9fe:a9fe", true}, // NAT64 of 169.254.169.254
		{"2002:7f00:1::", true},      // 6to4 of 127.0.0.1
		{"2002:c0a8:101::1", true},   // 6to4 of 192.168.1.1
		// Public addresses pass, including NAT64/6to4/mapped forms of them.
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"100.128.0.1", false},
		{"172.32.0.1", false},
		{"192.0.2.1", false},
		{"198.20.0.1", false},
		{"223.255.255.255", false},
		{"2606:4700:4700::1111", false},
		{"::ffff:8.8.8.8", false},
		{"64:ff9b::808:808", false},
		{"2002:808:808::1", false},
	}
	for _, c := range cases {
		addr := netip.MustParseAddr(c.addr)
		err := checkAddr(addr, nil)
		if got := err != nil; got != c.blocked {
			t.Errorf("%s: blocked=%v, want %v (%v)", c.addr, got, c.blocked, err)
			continue
		}
		if c.blocked {
			var be *BlockedAddressError
			if !errors.As(err, &be) || !errors.Is(err, ErrBlockedAddress) || !strings.Contains(err.Error(), addr.WithZone("").String()) {
				t.Errorf("%s: error %q does not name the address", c.addr, err)
			}
		}
		// The same verdict through the dialer hook, as "ip:port".
		derr := dialControl(nil)("tcp", netip.AddrPortFrom(addr.WithZone(""), 443).String(), nil)
		if (derr != nil) != c.blocked {
			t.Errorf("%s via dialControl: %v", c.addr, derr)
		}
	}
}

func TestSSRFAllowedCIDRsExempt(t *testing.T) {
	t.Parallel()
	allowed := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")}
	for addr, blocked := range map[string]bool{
		"127.0.0.1": false, "::ffff:127.0.0.1": false, "10.1.2.3": false, "10.2.0.1": true, "::1": true, "192.168.0.1": true,
	} {
		if err := checkAddr(netip.MustParseAddr(addr), allowed); (err != nil) != blocked {
			t.Errorf("%s with allowed %v: %v, want blocked=%v", addr, allowed, err, blocked)
		}
	}
}

func TestSSRFHostnameResolvingToBlockedAddress(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	port := rc.Listener.Addr().(interface{ String() string }).String()
	port = port[strings.LastIndex(port, ":"):]
	client := NewHTTPClient(nil, nil, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+port+"/hook", nil)
	resp, err := client.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a request to localhost went through (status %d)", resp.StatusCode)
	}
	if !errors.Is(err, ErrBlockedAddress) {
		t.Fatalf("error %v is not an SSRF refusal", err)
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("receiver got %d requests", n)
	}
	// Allowed explicitly, the same request goes through.
	client = NewHTTPClient(loopback, nil, 0)
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+port+"/hook", nil)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatalf("with 127.0.0.0/8 allowed: %v", err)
	}
	resp.Body.Close()
}

// An exemption of a whole address family turns the SSRF guard off; the
// deliverer says so at start, naming the variable. A narrow one does not.
func TestAllowAllCIDRWarnsAtStart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cidrs []string
		warn  []string
	}{
		{[]string{"0.0.0.0/0"}, []string{"0.0.0.0/0"}},
		{[]string{"127.0.0.0/8", "::/0"}, []string{"::/0"}},
		{[]string{"0.0.0.0/0", "::/0"}, []string{"0.0.0.0/0", "::/0"}},
		{[]string{"127.0.0.0/8", "10.0.0.0/8", "::1/128"}, nil},
	} {
		var logs bytes.Buffer
		var prefixes []netip.Prefix
		for _, s := range c.cidrs {
			prefixes = append(prefixes, netip.MustParsePrefix(s))
		}
		if _, err := NewDeliverer(nil, Config{AllowedCIDRs: prefixes, Logger: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatal(err)
		}
		var warned []string
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "SSRF guard is off") {
				if !strings.Contains(line, "WEBHOOK_ALLOWED_CIDRS") {
					t.Errorf("warning does not name the variable: %s", line)
				}
				for _, w := range c.warn {
					if strings.Contains(line, "cidr="+w) {
						warned = append(warned, w)
					}
				}
			}
		}
		if !slices.Equal(warned, c.warn) {
			t.Errorf("WEBHOOK_ALLOWED_CIDRS=%v: warned for %v, want %v\n%s", c.cidrs, warned, c.warn, logs.String())
		}
	}
}
