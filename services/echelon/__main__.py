from echelon.cli.main import main

main()
