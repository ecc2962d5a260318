package contract

import (
	"errors"
	"testing"
)

func TestMatchEventType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, eventType string
		want               bool
	}{
		{"*", "order.created", true},
		{"*", "", true},
		{"order.created", "order.created", true},
		{"order.created", "order.created.v2", false},
		{"order.created", "order.deleted", false},
		{"order.*", "order.created", true},
		{"order.*", "order.item.added", true},
		{"order.*", "order", false},
		{"order.*", "orders.created", false},
		{"order.*", "customer.order.created", false},
		{"order.item.*", "order.item.added", true},
		{"order.item.*", "order.created", false},
		{"order*", "order.created", false}, // no glob: only ".*" at the end is a wildcard
		{"order*", "order*", true},
	}
	for _, tt := range tests {
		if got := MatchEventType(tt.pattern, tt.eventType); got != tt.want {
			t.Errorf("MatchEventType(%q, %q) = %v, want %v", tt.pattern, tt.eventType, got, tt.want)
		}
	}
}

func TestFilterMatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		filter           Filter
		topic, eventType string
		want             bool
	}{
		{"exact", Filter{Enabled: true, EventTypes: []string{"a.b"}}, "t1", "a.b", true},
		{"any of several", Filter{Enabled: true, EventTypes: []string{"x.y", "a.*"}}, "t1", "a.b", true},
		{"none of several", Filter{Enabled: true, EventTypes: []string{"x.y", "b.*"}}, "t1", "a.b", false},
		{"disabled", Filter{Enabled: false, EventTypes: []string{"*"}}, "t1", "a.b", false},
		{"topic filter equal", Filter{Enabled: true, EventTypes: []string{"*"}, Topic: "t1"}, "t1", "a.b", true},
		{"topic filter other", Filter{Enabled: true, EventTypes: []string{"*"}, Topic: "t2"}, "t1", "a.b", false},
		{"no patterns", Filter{Enabled: true}, "t1", "a.b", false},
	}
	for _, tt := range tests {
		if got := tt.filter.Matches(tt.topic, tt.eventType); got != tt.want {
			t.Errorf("%s: Matches(%q, %q) = %v, want %v", tt.name, tt.topic, tt.eventType, got, tt.want)
		}
	}
}

func TestValidatePattern(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"*", "order.created", "order.*", "a.b.*", "order-created"} {
		if err := ValidatePattern(ok); err != nil {
			t.Errorf("ValidatePattern(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", " ", "order created", ".*", "order*", "a.*.b", "*.created", "**", "a\x01b", "order\x1b[31m", "order\x7f", "a\x00", "a\u200b\u0085"} {
		if err := ValidatePattern(bad); err == nil {
			t.Errorf("ValidatePattern(%q) = nil, want an error", bad)
		}
	}
}

func TestValidateEventTypes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		types []string
		ok    bool
	}{
		{[]string{"asset.created"}, true},
		{[]string{"asset.*", "order.paid"}, true},
		{[]string{"*"}, true},
		{nil, false},
		{[]string{}, false},
		{[]string{""}, false},
		{[]string{"asset.*", ""}, false},
		{[]string{".*"}, false},
		{[]string{"as*et"}, false},
		{[]string{"*.created"}, false},
		{[]string{"a.*.*"}, false},
		{[]string{"asset created"}, false},
	}
	for _, c := range cases {
		err := ValidateEventTypes(c.types)
		if (err == nil) != c.ok {
			t.Errorf("ValidateEventTypes(%q) = %v, want ok=%v", c.types, err, c.ok)
		}
		var pe *PatternError
		if err != nil && !errors.As(err, &pe) {
			t.Errorf("ValidateEventTypes(%q) = %T, want *PatternError", c.types, err)
		}
	}
}
