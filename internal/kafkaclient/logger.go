package kafkaclient

import (
	"context"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// clientLogger is franz-go's logger on top of ours. By default (level "")
// every client level is one step down on ours: its INFO (heartbeats,
// rebalances, "assigning partitions", metadata refreshes, several lines a
// second on a busy group) is our DEBUG, its WARN our INFO, its ERROR our
// WARN: the client retries what it reports, and the bridge itself logs
// what it cannot recover from (an outage, a parked row). With
// KAFKA_LOG_LEVEL set, the client's lines at or above that level are
// logged at their own level ("none": not at all); LOG_LEVEL still applies.
type clientLogger struct {
	log   *slog.Logger
	shift bool
	min   kgo.LogLevel // with !shift: the least severe client level logged
}

func newClientLogger(log *slog.Logger, level string) kgo.Logger {
	l := &clientLogger{log: log.With("component", "kgo")}
	switch strings.ToLower(level) {
	case "":
		l.shift = true
	case "none":
		l.min = kgo.LogLevelNone
	case "error":
		l.min = kgo.LogLevelError
	case "warn", "warning":
		l.min = kgo.LogLevelWarn
	case "info":
		l.min = kgo.LogLevelInfo
	default: // debug; config validated the value
		l.min = kgo.LogLevelDebug
	}
	return l
}

// slogLevel is the level a client line of level lv is written at.
func (l *clientLogger) slogLevel(lv kgo.LogLevel) slog.Level {
	var s slog.Level
	switch lv {
	case kgo.LogLevelError:
		s = slog.LevelError
	case kgo.LogLevelWarn:
		s = slog.LevelWarn
	case kgo.LogLevelInfo:
		s = slog.LevelInfo
	default:
		s = slog.LevelDebug
	}
	if l.shift {
		s -= 4 // one slog step: ERROR→WARN, WARN→INFO, INFO→DEBUG, DEBUG below DEBUG
	}
	return s
}

// Level is the most verbose client level that would reach the log, so the
// client does not format lines nobody writes.
func (l *clientLogger) Level() kgo.LogLevel {
	for _, lv := range []kgo.LogLevel{kgo.LogLevelDebug, kgo.LogLevelInfo, kgo.LogLevelWarn, kgo.LogLevelError} {
		if !l.shift && lv > l.min {
			continue
		}
		if l.log.Enabled(context.Background(), l.slogLevel(lv)) {
			return lv
		}
	}
	return kgo.LogLevelNone
}

func (l *clientLogger) Log(lv kgo.LogLevel, msg string, keyvals ...any) {
	if lv == kgo.LogLevelNone || (!l.shift && lv > l.min) {
		return
	}
	l.log.Log(context.Background(), l.slogLevel(lv), msg, keyvals...)
}
