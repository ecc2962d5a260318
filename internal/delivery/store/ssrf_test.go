package store

import (
	"net/netip"
	"strings"
	"testing"
)

// A URL whose host is a literal address the dialer refuses is refused in
// every spelling a resolver reads as that address; a host name is left to
// the dialer; WEBHOOK_ALLOWED_CIDRS exempts.
func TestCheckURLHostRefusesLiteralBlockedAddresses(t *testing.T) {
	for url, want := range map[string]string{
		"https://169.254.169.254/latest/meta-data": "169.254.169.254",
		"https://127.0.0.1:8443/":                  "127.0.0.1",
		"https://[::1]/":                           "::1",
		"https://[::ffff:127.0.0.1]/":              "IPv4-mapped",
		"https://[64:ff9b::a9fe:a9fe]/":            "embedded in NAT64 169.254.169.254",
		"https://0x7f000001/":                      "127.0.0.1",
		"https://2130706433/":                      "127.0.0.1",
		"https://0177.0.0.1/":                      "127.0.0.1",
		"https://127.1/":                           "127.0.0.1",
		"https://10.1.2.3/":                        "private, RFC 1918",
		"https://[fe80::1%25eth0]/":                "link-local",
		"https://0.0.0.0/":                         "this network",
	} {
		err := CheckURLHost(url, nil)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "WEBHOOK_ALLOWED_CIDRS") {
			t.Errorf("CheckURLHost(%q) = %v, want a refusal naming %q", url, err, want)
		}
	}
	for _, url := range []string{
		"https://example.com/", "https://localhost/", "https://93.184.215.14/", "https://[2606:4700::1111]/",
		"https://1.2.3.4.5/", "https://0x/", "https://256.1.1.1/", "https://12345678901/", "https://v1.example/",
	} {
		if err := CheckURLHost(url, nil); err != nil {
			t.Errorf("CheckURLHost(%q) = %v, want accepted (a name, or a public address)", url, err)
		}
	}
	allowed := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	if err := CheckURLHost("http://127.0.0.1:9/hook", allowed); err != nil {
		t.Errorf("127.0.0.1 with 127.0.0.0/8 allowed: %v", err)
	}
	if err := CheckURLHost("http://[::1]:9/hook", allowed); err == nil {
		t.Error("[::1] with only 127.0.0.0/8 allowed: accepted")
	}
}
