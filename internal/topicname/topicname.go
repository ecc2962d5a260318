// Package topicname is Kafka's rule for topic names, in one place: the
// public outbox package checks every event's topic with it, and the
// configuration checks the bridge's own topic settings
// (BRIDGE_OPERATIONS_TOPIC) with it at start-up. It imports nothing of the
// bridge, so both can use it without linking each other.
package topicname

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Problem says what is wrong with a topic name, or "" when Kafka accepts
// it. The rules are Kafka's (1–249 characters of [a-zA-Z0-9._-], not "." or
// ".."), plus its internal prefix "__"; the SQL function
// bridge.topic_name_problem (the baseline migration; PL/pgSQL since
// migration 00170) is the same check for callers of bridge.enqueue, and its
// messages match these.
func Problem(topic string) string {
	switch {
	case topic == "":
		return "it must not be empty"
	case utf8.RuneCountInString(topic) > 249:
		return fmt.Sprintf("it is %d characters long; at most 249 are allowed", utf8.RuneCountInString(topic))
	case topic == "." || topic == "..":
		return "'.' and '..' are not allowed"
	case strings.IndexFunc(topic, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}) >= 0:
		return "only ASCII letters, digits, '.', '_' and '-' are allowed"
	case strings.HasPrefix(topic, "__"):
		return "names starting with '__' are reserved for Kafka's internal topics"
	}
	return ""
}
