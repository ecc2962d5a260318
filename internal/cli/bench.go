package cli

import "github.com/spf13/cobra"

// `bridge bench` is the parent of the throughput commands (bench relay,
// bench deliver). Each lives in its own file and adds itself with
// registerBench in init, the way top-level commands use register.
func init() { register(newBenchCmd) }

var benchRegistry []func() *cobra.Command

func registerBench(f func() *cobra.Command) { benchRegistry = append(benchRegistry, f) }

func newBenchCmd() *cobra.Command {
	c := &cobra.Command{
		Use:     "bench",
		GroupID: groupSetup,
		Short:   "Measure throughput and latency on this machine (relay, deliver, pipeline)",
		Example: `  bridge bench deliver --subscriptions 10 --assets 100 --events 100000`,
	}
	for _, f := range benchRegistry {
		c.AddCommand(f())
	}
	return c
}
