from tidelog.cli.app import main

main()
