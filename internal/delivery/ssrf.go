package delivery

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

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

// checkAddr returns a *BlockedAddressError when addr may not be dialled.
// Forms that embed an IPv4 address — IPv4-mapped (::ffff:a.b.c.d), NAT64
// (64:ff9b::a.b.c.d) and 6to4 (2002:aabb:ccdd::) — are judged by the
// embedded address, since the packet ends up there.
func checkAddr(addr netip.Addr, allowed []netip.Prefix) error {
	addr = addr.WithZone("")
	for _, p := range allowed {
		if p.Contains(addr) || (addr.Is4In6() && p.Contains(addr.Unmap())) {
			return nil
		}
	}
	if addr.Is4In6() {
		if err := checkAddr(addr.Unmap(), allowed); err != nil {
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
	if err := checkAddr(embedded, allowed); err != nil {
		var be *BlockedAddressError
		errors.As(err, &be)
		return &BlockedAddressError{Addr: addr, Prefix: be.Prefix, Class: fmt.Sprintf("%s, embedded in %s %s", be.Class, kind, embedded)}
	}
	return nil
}

// dialControl is a net.Dialer.Control: it runs after DNS resolution, on the
// address actually being connected to, for every address the dialer tries. A
// check at subscription time or before the request would let DNS rebinding
// (public answer first, 127.0.0.1 on the next lookup) slip through.
func dialControl(allowed []netip.Prefix) func(network, address string, _ syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return fmt.Errorf("dial %s: %w", address, err)
		}
		addr, err := netip.ParseAddr(host)
		if err != nil {
			return fmt.Errorf("dial %s: not an IP address: %w", address, err)
		}
		return checkAddr(addr, allowed)
	}
}
