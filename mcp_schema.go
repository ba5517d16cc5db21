package main

// The input schemas of the MCP tools: JSON Schema (draft-07) as the
// reference's tools publish it, built from a few constructors, and the
// check of a call's arguments against it, so that a tool's code reads only
// arguments of the types it declared.

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// schema is one JSON Schema node. kind is "string", "number", "boolean",
// "object", "array", or "" for any value.
type schema struct {
	kind     string
	desc     string
	enum     []string
	min, max *float64
	minItems int
	uri      bool
	props    []schemaProp // an object's properties, in order
	items    *schema      // an array's items
	record   *schema      // an object of any keys whose values are this
	ref      string       // a definition of the tool's schema, by name
}

type schemaProp struct {
	name     string
	s        *schema
	required bool
}

func sStr(desc string) *schema  { return &schema{kind: "string", desc: desc} }
func sNum(desc string) *schema  { return &schema{kind: "number", desc: desc} }
func sBool(desc string) *schema { return &schema{kind: "boolean", desc: desc} }
func sAny(desc string) *schema  { return &schema{desc: desc} }

// sRecord is an object of any keys with values of any type (the job data).
func sRecord(desc string) *schema {
	return &schema{kind: "object", desc: desc, record: &schema{}}
}

func sEnum(desc string, values ...string) *schema {
	return &schema{kind: "string", desc: desc, enum: values}
}

func sArray(items *schema, desc string) *schema {
	return &schema{kind: "array", desc: desc, items: items}
}

func sObject(desc string, props ...schemaProp) *schema {
	return &schema{kind: "object", desc: desc, props: props}
}

func req(name string, s *schema) schemaProp { return schemaProp{name: name, s: s, required: true} }
func opt(name string, s *schema) schemaProp { return schemaProp{name: name, s: s} }

func (s *schema) atLeast(v float64) *schema { s.min = &v; return s }
func (s *schema) atMost(v float64) *schema  { s.max = &v; return s }
func (s *schema) nonEmpty() *schema         { s.minItems = 1; return s }
func (s *schema) asURI() *schema            { s.uri = true; return s }

// toolSchema is a tool's input schema: an object of the given properties,
// with its definitions (a recursive schema names itself through ref).
type toolSchema struct {
	top  *schema
	defs map[string]*schema
}

// MarshalJSON writes the schema as the MCP SDK publishes a tool's input
// schema, properties in order.
func (t toolSchema) MarshalJSON() ([]byte, error) {
	b := t.top.appendJSON(nil, true)
	if len(t.defs) > 0 {
		b = b[:len(b)-1]
		b = append(b, `,"definitions":{`...)
		names := make([]string, 0, len(t.defs))
		for n := range t.defs {
			names = append(names, n)
		}
		slices.Sort(names)
		for i, n := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, []byte(n))
			b = append(b, ':')
			b = t.defs[n].appendJSON(b, false)
		}
		b = append(b, "}}"...)
	}
	return b, nil
}

func (s *schema) appendJSON(b []byte, top bool) []byte {
	b = append(b, '{')
	n := 0
	key := func(k string) {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = appendJSONString(b, []byte(k))
		b = append(b, ':')
	}
	if s.ref != "" {
		key("$ref")
		b = appendJSONString(b, []byte("#/definitions/"+s.ref))
		return append(b, '}')
	}
	if s.desc != "" {
		key("description")
		b = appendJSONString(b, []byte(s.desc))
	}
	if s.kind != "" {
		key("type")
		b = appendJSONString(b, []byte(s.kind))
	}
	if s.uri {
		key("format")
		b = append(b, `"uri"`...)
	}
	if len(s.enum) > 0 {
		key("enum")
		b = appendJSONStrings(b, s.enum)
	}
	if s.min != nil {
		key("minimum")
		b = appendJSONNumber(b, *s.min)
	}
	if s.max != nil {
		key("maximum")
		b = appendJSONNumber(b, *s.max)
	}
	if s.minItems > 0 {
		key("minItems")
		b = strconv.AppendInt(b, int64(s.minItems), 10)
	}
	if s.items != nil {
		key("items")
		b = s.items.appendJSON(b, false)
	}
	if s.record != nil {
		key("propertyNames")
		b = append(b, `{"type":"string"}`...)
		key("additionalProperties")
		b = s.record.appendJSON(b, false)
	}
	if s.kind == "object" && s.record == nil {
		key("properties")
		var required []string
		b, required = s.appendProps(b)
		if len(required) > 0 {
			key("required")
			b = appendJSONStrings(b, required)
		}
	}
	if top {
		key("$schema")
		b = append(b, `"http://json-schema.org/draft-07/schema#"`...)
	}
	return append(b, '}')
}

// appendProps writes an object schema's properties, and answers the
// names of those required.
func (s *schema) appendProps(b []byte) (_ []byte, required []string) {
	b = append(b, '{')
	for i, p := range s.props {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, []byte(p.name))
		b = append(b, ':')
		b = p.s.appendJSON(b, false)
		if p.required {
			required = append(required, p.name)
		}
	}
	return append(b, '}'), required
}

// appendJSONStrings writes an array of strings.
func appendJSONStrings(b []byte, list []string) []byte {
	b = append(b, '[')
	for i, v := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, []byte(v))
	}
	return append(b, ']')
}

// check reports the first way v (as encoding/json decodes into any) does
// not fit the schema, naming where: "jobs[2].name: expected a string".
func (t toolSchema) check(v any) error { return t.checkAt(t.top, v, "", 0) }

// maxSchemaDepth bounds a recursive schema's walk (a flow's children):
// three levels a flow level (the children array, its $ref, the node), so
// that a flow is refused by its own depth limit, with its own message.
const maxSchemaDepth = 3*mcpFlowMaxDepth + 8

func (t toolSchema) checkAt(s *schema, v any, at string, depth int) error {
	if depth > maxSchemaDepth {
		return fmt.Errorf("%s: nested deeper than %d levels", at, maxSchemaDepth)
	}
	if s.ref != "" {
		return t.checkAt(t.defs[s.ref], v, at, depth+1)
	}
	where := at
	if where == "" {
		where = "arguments"
	}
	switch s.kind {
	case "":
		return nil
	case "string":
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: expected a string, received %s", where, jsonTypeName(v))
		}
		if len(s.enum) > 0 && !slices.Contains(s.enum, str) {
			return fmt.Errorf("%s: expected one of %s", where, strings.Join(quoteAll(s.enum), ", "))
		}
		if s.uri {
			if u, err := url.Parse(str); err != nil || u.Scheme == "" || !strings.Contains(str, ":") {
				return fmt.Errorf("%s: invalid URL", where)
			}
		}
	case "number":
		f, ok := v.(float64)
		if !ok {
			return fmt.Errorf("%s: expected a number, received %s", where, jsonTypeName(v))
		}
		if s.min != nil && f < *s.min {
			return fmt.Errorf("%s: too small: expected a number >= %s", where, appendJSONNumber(nil, *s.min))
		}
		if s.max != nil && f > *s.max {
			return fmt.Errorf("%s: too big: expected a number <= %s", where, appendJSONNumber(nil, *s.max))
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: expected a boolean, received %s", where, jsonTypeName(v))
		}
	case "array":
		list, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: expected an array, received %s", where, jsonTypeName(v))
		}
		if len(list) < s.minItems {
			return fmt.Errorf("%s: too small: expected an array of at least %d items", where, s.minItems)
		}
		for i, item := range list {
			if err := t.checkAt(s.items, item, fmt.Sprintf("%s[%d]", at, i), depth+1); err != nil {
				return err
			}
		}
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: expected an object, received %s", where, jsonTypeName(v))
		}
		return t.checkObject(s, obj, at, depth)
	}
	return nil
}

// checkObject is checkAt for an object: a record's every value, or each
// property, the required ones present.
func (t toolSchema) checkObject(s *schema, obj map[string]any, at string, depth int) error {
	if s.record != nil {
		for k, item := range obj {
			if err := t.checkAt(s.record, item, joinPath(at, k), depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range s.props {
		item, ok := obj[p.name]
		if !ok {
			if p.required {
				return fmt.Errorf("%s: required", joinPath(at, p.name))
			}
			continue
		}
		if err := t.checkAt(p.s, item, joinPath(at, p.name), depth+1); err != nil {
			return err
		}
	}
	return nil
}

func joinPath(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}

func quoteAll(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strconv.Quote(v)
	}
	return out
}

// jsonKind names a decoded JSON value's type, for a refusal.
func jsonTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case float64, json.Number:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
