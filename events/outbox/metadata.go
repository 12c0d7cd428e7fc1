package outbox

import (
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
)

func metadataJSON(md message.Metadata) (string, error) {
	if md == nil {
		return "{}", nil
	}
	b, err := json.Marshal(map[string]string(md))
	return string(b), err
}
