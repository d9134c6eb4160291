// Package decoder is the JSON decoder of Mercator's machine-to-machine hot
// paths where it measured faster: the events agents send (every heartbeat
// is one), decoded 4-5 times faster than by encoding/json, and the
// documents a store reads back (a run: 1.2-1.5 times). Those decodes were
// 5-9% of the control plane's CPU in a fleet simulation's profile.
// BenchmarkDecode prints both decoders side by side on Mercator's own
// types, the session stream's commands included: on those it gained
// nothing (0.84-1.09 of encoding/json's time), so the agent's session
// reader keeps encoding/json. The decoder is github.com/segmentio/encoding's.
//
// The contract: for every input, Unmarshal and Strict leave v exactly as
// encoding/json would and succeed or fail exactly when encoding/json does
// (FuzzAgreesWithStd checks it on the hot types); when they fail, the
// error is encoding/json's own, because the input is decoded again by it
// to say what was wrong, and what v then holds is what encoding/json
// leaves after an error: unspecified. That second decode costs only on
// malformed input, which is rare and is answered with an error anyway, and
// it keeps error messages the same wherever they reach a person or a log.
//
// Encoding stays with encoding/json: the node protocol uses its omitzero
// option, which the faster encoders do not honour, and no encode was
// costly enough in the profiles to be worth a second encoder.
//
// Request bodies typed by people (the API's runs, functions, tokens) keep
// controlplane/internal/httpapi's streaming encoding/json decoder: their
// errors name the field and the expected type, and they are not hot.
package decoder

import (
	"bytes"
	"encoding/json"
	"errors"

	segjson "github.com/segmentio/encoding/json"
)

// Unmarshal decodes data into v as encoding/json.Unmarshal does: unknown
// fields are ignored, trailing data after the value is an error.
func Unmarshal(data []byte, v any) error {
	if segjson.Unmarshal(data, v) == nil {
		return nil
	}
	return json.Unmarshal(data, v)
}

// Strict decodes data, which must hold exactly one JSON value, into v
// refusing fields that v does not have, as an encoding/json.Decoder with
// DisallowUnknownFields over data followed by a check for trailing data
// does. On failure the error is the one that decoder gives (ErrTrailing for
// data after the value), so callers can tell a type error from a syntax
// error or an unknown field as they did before.
func Strict(data []byte, v any) error {
	if rest, err := segjson.Parse(data, v, segjson.DisallowUnknownFields); err == nil && len(rest) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return ErrTrailing
	}
	return nil
}

// ErrTrailing is Strict's error for data after the one JSON value.
var ErrTrailing = errors.New("trailing data after the JSON value")
