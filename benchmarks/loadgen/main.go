// The gateway benchmark's scripted upstream and load generator, compiled so
// that on a small machine their own CPU leaves the gateway room to measure.
//
//	loadgen upstream PORT INTERVAL_MS     serve a Messages event stream of 24 events
//	loadgen load URL CONCURRENCY COUNT [anonymous]
//	                                       send COUNT streaming requests, CONCURRENCY at a time
//	                                       (anonymous: without the session header, which a gateway
//	                                       forwards without attesting)
//
// load first sends one request on each of its CONCURRENCY connections, not
// measured: a connection's set-up (TCP, the first request through each
// layer) is paid once per agent, not per request. It then prints one JSON
// object: requests per second and the p50/p99 time to the first body byte
// and to the last, in milliseconds.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
)

const events = 24

var body = []byte(`{"model":"deepseek-v4-flash","max_tokens":1024,"stream":true,"system":"Be brief.",` +
	`"messages":[{"role":"user","content":[{"type":"text","text":"Say something."}]}]}`)

func upstream(port string, interval time.Duration) {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "text/event-stream")
		flusher := w.(http.Flusher)
		for i := 0; i < events; i++ {
			if i > 0 && interval > 0 {
				time.Sleep(interval) // the model's pace
			}
			fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"+
				"\"delta\":{\"type\":\"text_delta\",\"text\":\"token %d \"}}\n\n", i)
			flusher.Flush()
		}
	})
	if err := http.ListenAndServe("127.0.0.1:"+port, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func one(client *http.Client, url string, session int, anonymous bool) (float64, float64, error) {
	request, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	request.Header.Set("content-type", "application/json")
	if !anonymous {
		request.Header.Set("x-deepseek-harness-session-id", "bench-"+strconv.Itoa(session%500))
	}
	request.Header.Set("authorization", "Bearer benchmark")
	started := time.Now()
	response, err := client.Do(request)
	if err != nil {
		return 0, 0, err
	}
	defer response.Body.Close()
	buffer := make([]byte, 64*1024)
	var first time.Duration
	for {
		n, err := response.Body.Read(buffer)
		if n > 0 && first == 0 {
			first = time.Since(started)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if response.StatusCode != 200 {
		return 0, 0, fmt.Errorf("%s answered %d", url, response.StatusCode)
	}
	return first.Seconds() * 1000, time.Since(started).Seconds() * 1000, nil
}

func quantile(values []float64, q float64) float64 {
	sort.Float64s(values)
	index := int(float64(len(values)) * q)
	if index >= len(values) {
		index = len(values) - 1
	}
	return values[index]
}

func load(url string, concurrency, count int, anonymous bool) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency,
		DisableCompression: true}}
	var mutex sync.Mutex
	var firsts, lasts []float64
	var failure error
	var warm sync.WaitGroup // one request per connection first: connections open, caches warm
	for w := 0; w < concurrency; w++ {
		warm.Add(1)
		go func(w int) {
			defer warm.Done()
			if _, _, err := one(client, url, w, anonymous); err != nil {
				mutex.Lock()
				failure = err
				mutex.Unlock()
			}
		}(w)
	}
	warm.Wait()
	next := make(chan int, count)
	for i := 0; i < count; i++ {
		next <- i
	}
	close(next)
	started := time.Now()
	var group sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		group.Add(1)
		go func() {
			defer group.Done()
			for i := range next {
				first, last, err := one(client, url, i, anonymous)
				mutex.Lock()
				if err != nil {
					failure = err
				} else {
					firsts, lasts = append(firsts, first), append(lasts, last)
				}
				mutex.Unlock()
			}
		}()
	}
	group.Wait()
	if failure != nil {
		fmt.Fprintln(os.Stderr, failure)
		os.Exit(1)
	}
	elapsed := time.Since(started).Seconds()
	out, _ := json.Marshal(map[string]float64{
		"rps": float64(len(firsts)) / elapsed, "ttfb_p50": quantile(firsts, 0.5), "ttfb_p99": quantile(firsts, 0.99),
		"last_p50": quantile(lasts, 0.5), "last_p99": quantile(lasts, 0.99)})
	fmt.Println(string(out))
}

func main() {
	switch {
	case len(os.Args) == 4 && os.Args[1] == "upstream":
		interval, _ := strconv.Atoi(os.Args[3])
		upstream(os.Args[2], time.Duration(interval)*time.Millisecond)
	case (len(os.Args) == 5 || len(os.Args) == 6 && os.Args[5] == "anonymous") && os.Args[1] == "load":
		concurrency, _ := strconv.Atoi(os.Args[3])
		count, _ := strconv.Atoi(os.Args[4])
		load(os.Args[2], concurrency, count, len(os.Args) == 6)
	default:
		fmt.Fprintln(os.Stderr, "usage: loadgen upstream PORT INTERVAL_MS | loadgen load URL CONCURRENCY COUNT [anonymous]")
		os.Exit(2)
	}
}
