package config

import (
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// Setting is one effective configuration value, as `bridge config` prints it.
type Setting struct {
	Component string `json:"component"`
	Var       string `json:"var"`
	Value     string `json:"value"`
}

// Settings lists every variable the configuration reads with its effective
// value, secrets redacted: passwords inside URLs, tokens, SASL credentials.
func (c *Config) Settings() []Setting {
	var out []Setting
	v := reflect.ValueOf(c).Elem()
	for i := 0; i < v.NumField(); i++ {
		comp := v.Type().Field(i).Name
		sv := v.Field(i)
		for j := 0; j < sv.NumField(); j++ {
			f := sv.Type().Field(j)
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			if name == "" {
				continue
			}
			value := formatValue(sv.Field(j))
			switch f.Tag.Get("secret") {
			case "url":
				value = RedactURL(value)
			case "value":
				if value != "" {
					value = "[REDACTED]"
				}
			case "keyring":
				// Key ids only, never key material.
				if r := c.Secrets.Ring(); r != nil {
					value = "[REDACTED] keys: " + r.Describe()
				} else if value != "" {
					value = "[REDACTED]"
				}
			}
			out = append(out, Setting{Component: comp, Var: name, Value: value})
		}
	}
	return out
}

// Vars lists every environment variable the config structs read.
func Vars() []string {
	var out []string
	for name := range envFields() {
		out = append(out, name)
	}
	return out
}

func formatValue(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case []time.Duration:
		parts := make([]string, len(x))
		for i, d := range x {
			parts[i] = d.String()
		}
		return strings.Join(parts, ",")
	default:
		return fmt.Sprint(x)
	}
}

var keyValuePassword = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)

// RedactURL hides the password of a connection string, in URL or key=value
// form, so it can be logged and printed.
func RedactURL(s string) string {
	if s == "" {
		return s
	}
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return "[unparseable URL redacted]"
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "REDACTED")
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "REDACTED")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	return keyValuePassword.ReplaceAllString(s, "${1}REDACTED")
}
