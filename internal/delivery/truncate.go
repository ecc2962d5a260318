package delivery

import "strings"

// truncateUTF8 cuts s to at most n bytes on a rune boundary and makes it
// storable as PostgreSQL text (valid UTF-8, no NUL).
func truncateUTF8(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	// A cut inside a multi-byte rune leaves a replacement char at the end,
	// which is honest about the cut.
	return s
}
