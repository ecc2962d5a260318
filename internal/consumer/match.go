package consumer

import (
	"fmt"
	"strings"
	"unicode"
)

// Filter is what routes a record to a subscription: the subscription's
// enabled flag, its event-type patterns and its optional topic. It is the
// one place the routing rule is written down.
type Filter struct {
	Enabled bool
	// EventTypes: exact event types, "prefix.*" wildcards and "*".
	EventTypes []string
	// Topic: "" (a NULL column) matches every topic.
	Topic string
}

// Matches reports whether a record of topic carrying eventType becomes a
// delivery for the subscription: it must be enabled, its topic filter empty
// or equal, and any of its patterns must match.
func (f Filter) Matches(topic, eventType string) bool {
	if !f.Enabled || (f.Topic != "" && f.Topic != topic) {
		return false
	}
	for _, p := range f.EventTypes {
		if MatchEventType(p, eventType) {
			return true
		}
	}
	return false
}

// MatchEventType reports whether pattern matches eventType: "*" matches
// everything, "prefix.*" every event type that starts with "prefix." (not
// "prefix" itself), anything else only itself.
func MatchEventType(pattern, eventType string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasSuffix(pattern, ".*"):
		return strings.HasPrefix(eventType, pattern[:len(pattern)-1])
	default:
		return pattern == eventType
	}
}

// ValidateEventTypePattern rejects patterns that could never mean what their
// author intended: empty ones, whitespace, and a "*" anywhere but as the whole
// pattern or in a trailing ".*" after a non-empty prefix ("order*",
// "a.*.b" and ".*" match nothing useful).
func ValidateEventTypePattern(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("event type pattern is empty")
	case strings.IndexFunc(p, unicode.IsSpace) >= 0:
		return fmt.Errorf("event type pattern %q contains whitespace", p)
	case p == "*":
		return nil
	}
	body := strings.TrimSuffix(p, ".*")
	if body == "" || strings.Contains(body, "*") {
		return fmt.Errorf("event type pattern %q: use an exact type, \"prefix.*\" or \"*\"", p)
	}
	return nil
}
