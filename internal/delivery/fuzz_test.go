package delivery

import (
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// FuzzCheckAddr: any address the SSRF classifier accepts is in no refused
// range, judged independently of its tables by netip's own predicates, on
// the address, its IPv4-mapped form and the IPv4 address a NAT64 or 6to4
// address carries.
func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{"8.8.8.8", "127.0.0.1", "::1", "::ffff:127.0.0.1", "64:ff9b::a00:1", "2002:a00:1::",
		"169.254.169.254", "fe80::1%eth0", "::ffff:10.0.0.1", "2606:4700::1111", "0.0.0.0", "ff02::1", "fd00::1", "100.64.0.1"} {
		a := netip.MustParseAddr(s)
		b := a.As16()
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) != 16 && len(raw) != 4 {
			return
		}
		addr, _ := netip.AddrFromSlice(raw)
		if checkAddr(addr, nil) != nil {
			return
		}
		forms := []netip.Addr{addr, addr.Unmap()}
		b := addr.As16()
		if nat64.Contains(addr) {
			forms = append(forms, netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		}
		if sixToFour.Contains(addr) {
			forms = append(forms, netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		}
		for _, a := range forms {
			if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
				a.IsMulticast() || a.IsUnspecified() || a.IsInterfaceLocalMulticast() {
				t.Fatalf("checkAddr accepted %s (as %s), which is in a refused range", addr, a)
			}
			if a.Is4() && netip.MustParsePrefix("169.254.0.0/16").Contains(a) {
				t.Fatalf("checkAddr accepted %s: the cloud metadata range", addr)
			}
		}
	})
}

// FuzzParseRetryAfter: whatever an endpoint sends as Retry-After, the wait
// is never negative, never more than a year, and only for slow-down answers;
// the retry delay stays within twice the schedule.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"120", "0", "-5", "Wed, 21 Oct 2015 07:28:00 GMT", "99999999999999999999", " 7 ", "soon", ""} {
		f.Add(503, s)
		f.Add(500, s)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, v string) {
		h := http.Header{}
		h.Set("Retry-After", v)
		d, ok := parseRetryAfter(status, h, now)
		if d < 0 || d > 366*24*time.Hour && ok && v != "" && !isDate(v) {
			t.Fatalf("parseRetryAfter(%d, %q) = %s", status, v, d)
		}
		if ok && !slowDown(status) {
			t.Fatalf("Retry-After honoured for status %d", status)
		}
		scheduled := 5 * time.Minute
		if got := retryDelay(scheduled, jitter(scheduled), d, ok); got < 0 || got > 2*scheduled {
			t.Fatalf("retryDelay = %s, want within [0, %s]", got, 2*scheduled)
		}
	})
}

func isDate(v string) bool {
	_, err := http.ParseTime(v)
	return err == nil
}
