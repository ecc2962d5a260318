package delivery

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/outboxbridge/bridge/internal/delivery/store"
)

// ErrBlockedAddress is wrapped by every SSRF refusal (errors.Is). The rule
// is store.CheckAddr, shared with the subscription URL check.
var ErrBlockedAddress = store.ErrBlockedAddress

// BlockedAddressError says which address was refused and why.
type BlockedAddressError = store.BlockedAddressError

// nat64 and sixToFour are the IPv6 forms that embed an IPv4 address (the
// fuzz test checks the embedded address too).
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// checkAddr returns a *BlockedAddressError when addr may not be dialled.
func checkAddr(addr netip.Addr, allowed []netip.Prefix) error { return store.CheckAddr(addr, allowed) }

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
