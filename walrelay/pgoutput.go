package walrelay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// lsn is a WAL position.
type lsn uint64

func (l lsn) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// decodedMessage is one transactional logical decoding message.
type decodedMessage struct {
	lsn     lsn
	prefix  string
	content []byte
}

// txn is one committed transaction as pgoutput sends it.
type txn struct {
	xid       uint32
	commitLSN lsn // the commit record
	end       lsn // just past it: where the slot is confirmed to
	messages  []decodedMessage
}

var errProtocol = errors.New("walrelay: unexpected pgoutput data")

// txnAssembler turns pgoutput's begin, message and commit records into
// transactions. Only whole transactions come out: a begin without its
// commit (a read cut short) stays in cur and is never confirmed.
type txnAssembler struct {
	cur  *txn
	done []txn
}

// add decodes one record of pg_logical_slot_peek_binary_changes.
func (a *txnAssembler) add(data []byte) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty record", errProtocol)
	}
	switch data[0] {
	case 'B': // Begin: final lsn, commit time, xid
		if len(data) < 21 {
			return fmt.Errorf("%w: short begin", errProtocol)
		}
		a.cur = &txn{xid: binary.BigEndian.Uint32(data[17:21])}
	case 'M': // Message: flags, lsn, prefix\0, length, content
		if len(data) < 10 {
			return fmt.Errorf("%w: short message", errProtocol)
		}
		transactional := data[1]&1 == 1
		at := lsn(binary.BigEndian.Uint64(data[2:10]))
		rest := data[10:]
		i := bytes.IndexByte(rest, 0)
		if i < 0 || len(rest) < i+5 {
			return fmt.Errorf("%w: malformed message at %s", errProtocol, at)
		}
		prefix := string(rest[:i])
		n := int(binary.BigEndian.Uint32(rest[i+1 : i+5]))
		body := rest[i+5:]
		if len(body) < n {
			return fmt.Errorf("%w: message at %s shorter than its length", errProtocol, at)
		}
		// A non-transactional message (none of the writer's) is not part
		// of any commit: ignored.
		if transactional && a.cur != nil {
			a.cur.messages = append(a.cur.messages, decodedMessage{lsn: at, prefix: prefix, content: body[:n]})
		}
	case 'C': // Commit: flags, commit lsn, end lsn, commit time
		if len(data) < 26 {
			return fmt.Errorf("%w: short commit", errProtocol)
		}
		if a.cur == nil {
			return fmt.Errorf("%w: commit without begin", errProtocol)
		}
		a.cur.commitLSN = lsn(binary.BigEndian.Uint64(data[2:10]))
		a.cur.end = lsn(binary.BigEndian.Uint64(data[10:18]))
		a.done = append(a.done, *a.cur)
		a.cur = nil
	default:
		// Relation, type and origin records do not come with an empty
		// publication; anything else is not ours.
	}
	return nil
}
