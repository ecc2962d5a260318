package store

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// The SSRF rule, in one place: which destination addresses a webhook may
// not reach. The deliverer's dialer applies it to every address it
// connects to (internal/delivery, after DNS, so rebinding cannot slip
// through); a subscription whose URL names a blocked address literally is
// refused when it is created or updated (ValidateURL), rather than failing
// every attempt of its retry schedule and disabling itself days later.

// ErrBlockedAddress is wrapped by every SSRF refusal (errors.Is).
var ErrBlockedAddress = errors.New("destination address is blocked")

// BlockedAddressError says which address was refused and why.
type BlockedAddressError struct {
	Addr   netip.Addr
	Prefix netip.Prefix
	Class  string
}

func (e *BlockedAddressError) Error() string {
	return fmt.Sprintf("refused to connect to %s: in %s (%s), blocked to prevent SSRF; allow it with WEBHOOK_ALLOWED_CIDRS", e.Addr, e.Prefix, e.Class)
}

func (e *BlockedAddressError) Unwrap() error { return ErrBlockedAddress }

type blockedRange struct {
	prefix netip.Prefix
	class  string
}

// blockedV4 and blockedV6 are what a webhook sender refuses by default: a
// subscriber's URL must never reach the bridge's own network, the cloud
// metadata service (169.254.169.254) or the host itself.
var blockedV4 = []blockedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "this network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private, RFC 1918"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local, cloud metadata"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private, RFC 1918"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private, RFC 1918"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
}

var blockedV6 = []blockedRange{
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fc00::/7"), "unique local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// CheckAddr returns a *BlockedAddressError when addr may not be dialled
// (the deliverer's dialer, on every connection) or stored as a
// subscription's literal host (ValidateURL).
// Forms that embed an IPv4 address — IPv4-mapped (::ffff:a.b.c.d), NAT64
// (64:ff9b::a.b.c.d) and 6to4 (2002:aabb:ccdd::) — are judged by the
// embedded address, since the packet ends up there.
func CheckAddr(addr netip.Addr, allowed []netip.Prefix) error {
	addr = addr.WithZone("")
	for _, p := range allowed {
		if p.Contains(addr) || (addr.Is4In6() && p.Contains(addr.Unmap())) {
			return nil
		}
	}
	if addr.Is4In6() {
		if err := CheckAddr(addr.Unmap(), allowed); err != nil {
			var be *BlockedAddressError
			errors.As(err, &be)
			return &BlockedAddressError{Addr: addr, Prefix: be.Prefix, Class: be.Class + ", IPv4-mapped"}
		}
		return nil
	}
	if addr.Is4() {
		for _, r := range blockedV4 {
			if r.prefix.Contains(addr) {
				return &BlockedAddressError{Addr: addr, Prefix: r.prefix, Class: r.class}
			}
		}
		return nil
	}
	for _, r := range blockedV6 {
		if r.prefix.Contains(addr) {
			return &BlockedAddressError{Addr: addr, Prefix: r.prefix, Class: r.class}
		}
	}
	b := addr.As16()
	var embedded netip.Addr
	var kind string
	switch {
	case nat64.Contains(addr):
		embedded, kind = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), "NAT64"
	case sixToFour.Contains(addr):
		embedded, kind = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), "6to4"
	default:
		return nil
	}
	if err := CheckAddr(embedded, allowed); err != nil {
		var be *BlockedAddressError
		errors.As(err, &be)
		return &BlockedAddressError{Addr: addr, Prefix: be.Prefix, Class: fmt.Sprintf("%s, embedded in %s %s", be.Class, kind, embedded)}
	}
	return nil
}

// CheckURLHost refuses a URL whose host is a literal address the dialer
// would refuse (CheckAddr, less the allowed prefixes): 169.254.169.254,
// 127.0.0.1, [::1], [::ffff:127.0.0.1], and the numeric forms a resolver
// reads as IPv4 (0x7f000001, 2130706433, 0177.0.0.1, 127.1). A host name
// is not resolved here: what it points to is checked at dial time, on
// every attempt.
func CheckURLHost(raw string, allowed []netip.Prefix) error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil // ValidateURL says what is wrong with it
	}
	host := u.Hostname()
	addr, err := netip.ParseAddr(host)
	if err != nil {
		var ok bool
		if addr, ok = legacyIPv4(host); !ok {
			return nil
		}
	}
	if err := CheckAddr(addr, allowed); err != nil {
		var be *BlockedAddressError
		errors.As(err, &be)
		return &ValidationError{Field: "url", Value: shorten(raw), Problem: fmt.Sprintf(
			"points at %s, in %s (%s), which webhooks may not reach (SSRF); allow it with WEBHOOK_ALLOWED_CIDRS", be.Addr, be.Prefix, be.Class)}
	}
	return nil
}

// legacyIPv4 reads the inet_aton forms of an IPv4 address: one to four
// parts separated by dots, each decimal, octal (leading 0) or hex (0x), the
// last filling the remaining bytes. Resolvers (and so curl, browsers, some
// HTTP clients) accept them; a host of this shape is an address, not a
// name.
func legacyIPv4(host string) (netip.Addr, bool) {
	parts := strings.Split(host, ".")
	if len(parts) > 4 || host == "" {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base := 10
		switch {
		case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, p = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var out uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		out |= v << (24 - 8*i)
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	out |= last
	return netip.AddrFrom4([4]byte{byte(out >> 24), byte(out >> 16), byte(out >> 8), byte(out)}), true
}
