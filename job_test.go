package main

import (
	"reflect"
	"testing"
)

// TestReadCopyHasEveryField: the copy a reader gets (Job.readCopy) has
// every wire field of the job, its state and its failure, and none of the
// slices that may change in place is shared. A field added to Job and not
// to readCopy fails here.
func TestReadCopyHasEveryField(t *testing.T) {
	j := &Job{state: StateFailed, failErr: "boom", hasFail: true}
	v := reflect.ValueOf(j).Elem()
	for i := 0; i < v.NumField(); i++ {
		f, sf := v.Field(i), v.Type().Field(i)
		if !sf.IsExported() {
			continue
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString("s" + sf.Name)
		case reflect.Int64, reflect.Int32:
			f.SetInt(int64(i + 1))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Pointer:
			f.Set(reflect.New(sf.Type.Elem()))
		case reflect.Slice:
			f.Set(reflect.MakeSlice(sf.Type, 2, 2))
		default:
			t.Fatalf("field %s: kind %s not filled by this test", sf.Name, f.Kind())
		}
	}
	c := j.readCopy()
	cv := reflect.ValueOf(c).Elem()
	for i := 0; i < v.NumField(); i++ {
		sf := v.Type().Field(i)
		if !sf.IsExported() {
			continue
		}
		if !reflect.DeepEqual(v.Field(i).Interface(), cv.Field(i).Interface()) {
			t.Errorf("field %s not copied", sf.Name)
		}
	}
	if c.state != j.state || c.failErr != j.failErr || c.hasFail != j.hasFail {
		t.Error("state or failure not copied")
	}
	for name, pair := range map[string][2]any{
		"DependsOn": {&j.DependsOn[0], &c.DependsOn[0]}, "Children": {&j.Children[0], &c.Children[0]},
		"Tags": {&j.Tags[0], &c.Tags[0]}, "Stack": {&j.Stack[0], &c.Stack[0]},
		"Timeline": {&j.Timeline[0], &c.Timeline[0]},
	} {
		if pair[0] == pair[1] {
			t.Errorf("%s shared with the job", name)
		}
	}
}
