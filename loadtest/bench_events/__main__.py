from loadtest.bench_events.run import main

main()
