package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/internal/redact"
)

// Every command that changes state records what it did in the operators'
// audit (package actionlog, the table the console's Actions page reads):
// who (the OS user at this host), the command line with its secrets
// masked, what, on which rows, how many, and the error if it failed. A
// change in the database commits with its record, or not at all.

// maxCommand bounds the command line a record keeps (a --projection-sql
// may be long).
const maxCommand = 2000

// actor is who the tool's actions are recorded as: user@host, and the
// command line.
func (e *env) actor(cmd *cobra.Command, args []string) actionlog.Actor {
	name := ""
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		name = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return actionlog.Actor{Kind: actionlog.CLI, ID: name + "@" + host, Name: name, Command: e.commandLine(cmd, args)}
}

// commandLine is the command as run: its path, the flags of its own given
// (never the root's, which carry the connection strings and keys: they
// configure the tool, they are not the action), and its arguments. A flag
// whose name says secret (redact.SecretParam) is masked, and whatever
// quotes a configured connection string's secret is scrubbed (redact.Text).
func (e *env) commandLine(cmd *cobra.Command, args []string) string {
	parts := []string{cmd.CommandPath()}
	inherited := cmd.InheritedFlags()
	cmd.Flags().Visit(func(f *pflag.Flag) { // in name order
		if inherited.Lookup(f.Name) != nil {
			return
		}
		values := []string{f.Value.String()}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			values = sv.GetSlice()
		}
		for _, v := range values {
			if redact.SecretParam(f.Name) {
				v = redact.Mask
			}
			if f.Value.Type() == "bool" && v == "true" {
				parts = append(parts, "--"+f.Name)
				continue
			}
			parts = append(parts, "--"+f.Name+"="+shellQuote(v))
		}
	})
	for _, a := range args {
		parts = append(parts, shellQuote(a))
	}
	line := redact.Text(strings.Join(parts, " "), e.flags.ConnectionStrings()...)
	if len(line) > maxCommand {
		line = strings.ToValidUTF8(line[:maxCommand], "") + "…"
	}
	return line
}

// shellQuote quotes v for a shell when it needs it, so that the recorded
// line reads as the command typed.
func shellQuote(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n'\"\\$`;&|<>()*?[]{}#~!") {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// recorded runs do and its record in one transaction (actionlog.Do): the
// change and its record commit together, or neither; a do that fails is
// recorded alone with its error, which recorded returns.
func (e *env) recorded(cmd *cobra.Command, args []string, pool *pgxpool.Pool, entry actionlog.Entry,
	do func(ctx context.Context, tx pgx.Tx) (int64, error),
) (int64, error) {
	entry.Actor = e.actor(cmd, args)
	var n int64
	_, doErr, err := actionlog.Do(cmd.Context(), pool, entry, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var err error
		n, err = do(ctx, tx)
		return n, err
	})
	if err != nil {
		if doErr != nil {
			return 0, errors.Join(doErr, fmt.Errorf("and its record failed: %w", err))
		}
		return 0, err
	}
	return n, doErr
}

// recordAfter records what was done outside a transaction of the database
// (a replay published to a broker, a change the library commits itself):
// after it, with its outcome: n rows, done before doErr if it failed
// (a replay that failed part way published some), and doErr, which it
// returns. A record that fails is said, with what was done.
func (e *env) recordAfter(cmd *cobra.Command, args []string, pool *pgxpool.Pool, entry actionlog.Entry, n int64, doErr error) error {
	entry.Actor, entry.Count = e.actor(cmd, args), n
	if doErr != nil {
		entry.Error = doErr.Error()
	}
	ctx, cancel := actionlog.Detach(cmd.Context())
	defer cancel()
	if _, err := actionlog.Insert(ctx, pool, entry); err != nil {
		if doErr != nil {
			return errors.Join(doErr, fmt.Errorf("and its record failed: %w", err))
		}
		return fmt.Errorf("done (%d), but not recorded in the audit: %w", n, err)
	}
	return doErr
}

// maxRecordedIDs bounds the aggregate ids a record lists: the rest are
// counted (more_ids).
const maxRecordedIDs = 100

// aggregatesTarget is the aggregates a replay or a reset names, as a
// record keeps them; and the one aggregate, when there is one, that the
// record is indexed by (its journey lists it).
func aggregatesTarget(aggType string, ids []string) (list []string, more int, oneType, oneID string) {
	if len(ids) == 1 {
		return ids, 0, aggType, ids[0]
	}
	if len(ids) > maxRecordedIDs {
		return ids[:maxRecordedIDs], len(ids) - maxRecordedIDs, "", ""
	}
	return ids, 0, "", ""
}

// rowsTarget is what a retry or a discard names, in the console's shape
// (the Actions page reads both alike): some ids, or all of a filter.
type rowsTarget struct {
	IDs   []int64 `json:"ids,omitempty"`
	All   bool    `json:"all,omitempty"`
	Topic string  `json:"topic,omitempty"`
}

func idsOrAll(id int64, all bool) rowsTarget {
	if all {
		return rowsTarget{All: true}
	}
	return rowsTarget{IDs: []int64{id}}
}
