package deliverbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outboxbridge/bridge/internal/delivery"
)

// memberProcs are the fast lane's members as separate `bridge deliver`
// processes (FastLaneOptions.Member): each with its own Go runtime, pool,
// Kafka client and slow-lane deliverer, as a user runs replicas.
type memberProcs struct {
	cmds   []*exec.Cmd
	exited []chan struct{}
	errs   []error
}

// memberEnv is what a member process is started with beyond the
// environment: the scratch database, the bench's topic and group, the
// bench's receiver allowed, its plain-text secrets readable, and the
// deliverer's settings of this run.
func memberEnv(o Options, dc delivery.Config, topic, group string, conns int32) []string {
	env := []string{
		"DATABASE_URL=" + o.Kafka.DatabaseURL,
		"DATABASE_MAX_CONNS=" + strconv.Itoa(int(conns)),
		"CONSUMER_TOPICS=" + topic,
		"CONSUMER_GROUP=" + group,
		"HTTP_ADDR=off",
		"WEBHOOK_FAST_LANE=true",
		"WEBHOOK_ALLOWED_CIDRS=127.0.0.0/8",
		"WEBHOOK_ALLOW_HTTP=true",
		"WEBHOOK_WORKERS=" + strconv.Itoa(dc.Workers),
		"WEBHOOK_MAX_IN_FLIGHT_PER_SUBSCRIPTION=" + strconv.Itoa(dc.MaxInFlightPerSubscription),
		"BRIDGE_ALLOW_PLAINTEXT_SECRETS=true",
		"LOG_LEVEL=" + cmp.Or(os.Getenv("LOG_LEVEL"), "warn"),
	}
	if o.Kafka.InFlightLimit != "" {
		env = append(env, "WEBHOOK_FAST_LANE_IN_FLIGHT_LIMIT="+o.Kafka.InFlightLimit)
	}
	return env
}

// startMembers starts n member processes.
func startMembers(o Options, env []string, n int) (*memberProcs, error) {
	m := &memberProcs{}
	for range n {
		cmd := o.Kafka.Member(env)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			_ = m.stop()
			return nil, fmt.Errorf("start a member: %w", err)
		}
		i := len(m.cmds)
		m.cmds, m.exited, m.errs = append(m.cmds, cmd), append(m.exited, make(chan struct{})), append(m.errs, nil)
		go func() { m.errs[i] = cmd.Wait(); close(m.exited[i]) }()
	}
	return m, nil
}

// gone returns an error when a member has exited.
func (m *memberProcs) gone() error {
	for i := range m.cmds {
		select {
		case <-m.exited[i]:
			return fmt.Errorf("member %d exited: %v", i+1, m.errs[i])
		default:
		}
	}
	return nil
}

// cpu is the members' CPU time so far (ok false where /proc cannot show
// it, or m is nil).
func (m *memberProcs) cpu() (total time.Duration, ok bool) {
	if m == nil {
		return 0, false
	}
	ok = true
	for _, c := range m.cmds {
		d, ok2 := pidCPU("/proc/" + strconv.Itoa(c.Process.Pid))
		total, ok = total+d, ok && ok2
	}
	return total, ok
}

// stop sends every member SIGTERM and waits for it (killed after 30 s).
func (m *memberProcs) stop() error {
	if m == nil {
		return nil
	}
	for _, c := range m.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	for i, c := range m.cmds {
		select {
		case <-m.exited[i]:
			if m.errs[i] != nil {
				errs = append(errs, fmt.Errorf("member %d: %w", i+1, m.errs[i]))
			}
		case <-time.After(30 * time.Second):
			_ = c.Process.Kill()
			<-m.exited[i]
			errs = append(errs, fmt.Errorf("member %d did not stop within 30s of SIGTERM", i+1))
		}
	}
	m.cmds = nil
	return errors.Join(errs...)
}

// groupSpread reports whether group is stable with n members that own all
// parts partitions of topic between them, each within one of the others.
func groupSpread(ctx context.Context, adm *kadm.Client, group, topic string, n, parts int) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gs, err := adm.DescribeGroups(dctx, group)
	if err != nil {
		return false, nil // the coordinator may not know the group yet
	}
	g, ok := gs[group]
	if !ok || g.Err != nil || !strings.EqualFold(g.State, "Stable") || len(g.Members) != n {
		return false, nil
	}
	total, lo, hi := 0, parts, 0
	for _, mem := range g.Members {
		c, ok := mem.Assigned.AsConsumer()
		if !ok {
			return false, nil
		}
		k := 0
		for _, t := range c.Topics {
			if t.Topic == topic {
				k += len(t.Partitions)
			}
		}
		total, lo, hi = total+k, min(lo, k), max(hi, k)
	}
	return total == parts && hi-lo <= 1, nil
}
