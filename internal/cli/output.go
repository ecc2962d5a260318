package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/outboxbridge/bridge/internal/adminapi"
)

// addOutputFlag adds -o/--output (table|json) to a listing command.
func addOutputFlag(c *cobra.Command) *string {
	return c.Flags().StringP("output", "o", "table", "output format: table or json")
}

// runWithOutput adds -o/--output to c and makes run its RunE, called with
// the format once it is known to be table or json: a bad -o exits 2 before
// anything connects or writes. It returns the flag's value for a caller that
// hands the format on.
func runWithOutput(c *cobra.Command, run func(cmd *cobra.Command, args []string, out string) error) *string {
	out := addOutputFlag(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(*out); err != nil {
			return err
		}
		return run(cmd, args, *out)
	}
	return out
}

func checkOutput(format string) error {
	if format != "table" && format != "json" {
		return UsageErrorf("--output must be table or json, got %q", format)
	}
	return nil
}

// printList writes a listing as -o json: {"items": [...], "next_cursor": …},
// the admin API's shape, with [] rather than null for no items.
func printList[T any](w io.Writer, items []T, nextCursor string) error {
	if items == nil {
		items = []T{}
	}
	return printJSON(w, adminapi.List[T]{Items: items, NextCursor: nextCursor})
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printTable writes aligned columns for humans. Every cell goes through
// termSafe: cells hold text others wrote (an endpoint's answer, an
// operator's --reason, an application's asset id), and printed raw an
// answer of "ESC]0;…BEL ESC[2J" retitles and clears the operator's
// terminal, and a newline or tab in an asset id breaks the table's rows.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, h := range header {
		if i > 0 {
			fmt.Fprint(tw, "\t")
		}
		fmt.Fprint(tw, termSafe(h))
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, termSafe(c))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// termSafe shows control characters as Go escapes (\x1b, \n, \u009b) so
// they are seen rather than obeyed: C0 controls and DEL, the C1 controls
// (U+0080–U+009F, which some terminals treat as CSI/OSC introducers),
// bidirectional overrides (which reorder what the operator reads) and bytes
// that are not UTF-8. Printable text, accented or not, stays as it is.
// -o json needs none of this: its encoder already escapes control
// characters.
func termSafe(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeRune(r):
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\n', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}
