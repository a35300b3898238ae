from echelon.cli import main

main()
