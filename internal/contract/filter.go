package contract

import (
	"strconv"
	"strings"
	"unicode"
)

// Filter is what routes a record to a subscription: the subscription's
// enabled flag, its event-type patterns and its optional topic. The consumer
// matches with it; the subscription store validates the patterns with
// ValidateEventTypes before they are saved, so a pattern that could never
// match is refused where it enters rather than silently routing nothing.
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
// "prefix" itself), anything else only itself. There is no other glob:
// "order*" matches only the event type "order*".
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

// PatternError says which event-type pattern is refused and why.
type PatternError struct {
	// Value is the offending pattern ("" when the list itself is empty; the
	// whole list, comma-separated, when one entry is empty).
	Value   string
	Problem string
}

func (e *PatternError) Error() string {
	if e.Value == "" {
		return "event types " + e.Problem
	}
	return "event type " + quote(e.Value) + " " + e.Problem
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

// ValidateEventTypes accepts a non-empty list of exact names, "prefix.*"
// wildcards and "*". It refuses what could never mean what its author
// intended: an empty list or entry, whitespace, and a "*" anywhere but as the
// whole pattern or in a trailing ".*" after a non-empty prefix ("order*",
// "a.*.b" and ".*" would match nothing, or only themselves).
func ValidateEventTypes(types []string) error {
	if len(types) == 0 {
		return &PatternError{Problem: "must list at least one event type (exact name, prefix.* or *)"}
	}
	for _, t := range types {
		if t == "" {
			return &PatternError{Value: strings.Join(types, ","), Problem: "contains an empty event type"}
		}
		if err := ValidatePattern(t); err != nil {
			return err
		}
	}
	return nil
}

// ValidatePattern checks one event-type pattern (see ValidateEventTypes).
func ValidatePattern(p string) error {
	switch {
	case p == "":
		return &PatternError{Problem: "contains an empty event type"}
	case strings.IndexFunc(p, unicode.IsSpace) >= 0:
		return &PatternError{Value: p, Problem: "must not contain whitespace"}
	case strings.IndexFunc(p, unicode.IsControl) >= 0:
		// An event type is one line of text (a webhook header's value);
		// a control character in a pattern could never match one.
		return &PatternError{Value: strconv.QuoteToASCII(p), Problem: "must not contain control characters"}
	case p == "*":
	case strings.HasSuffix(p, ".*"):
		if prefix := strings.TrimSuffix(p, ".*"); prefix == "" || strings.Contains(prefix, "*") {
			return &PatternError{Value: p, Problem: "is not a valid wildcard (use prefix.* or *)"}
		}
	case strings.Contains(p, "*"):
		return &PatternError{Value: p, Problem: "may use * only as a whole type or as a final .* (prefix.*)"}
	}
	return nil
}
