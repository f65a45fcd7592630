set datafile missing '?'
set terminal pngcairo size 1100,600 font 'sans,11' noenhanced
set output 'results/study/report/fmnist-mlp-efficiency.png'
set grid
set logscale x 2
set xrange [0.8333333333333334:9.6]
set xlabel 'replicas'
set key outside right top
set title 'fmnist-mlp: scaling efficiency'
set ylabel 'efficiency (%)'
set yrange [0:*]
plot 100 with lines dt 2 lc 'gray' title 'ideal', 'results/study/report/data/fmnist-mlp-scaling-0.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.025-lr_scalinglinear', 'results/study/report/data/fmnist-mlp-scaling-1.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.025-lr_scalingnone', 'results/study/report/data/fmnist-mlp-scaling-2.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.025-lr_scalingsqrt', 'results/study/report/data/fmnist-mlp-scaling-3.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.05-lr_scalinglinear', 'results/study/report/data/fmnist-mlp-scaling-4.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.05-lr_scalingnone', 'results/study/report/data/fmnist-mlp-scaling-5.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.05-lr_scalingsqrt', 'results/study/report/data/fmnist-mlp-scaling-6.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.1-lr_scalinglinear', 'results/study/report/data/fmnist-mlp-scaling-7.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.1-lr_scalingnone', 'results/study/report/data/fmnist-mlp-scaling-8.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.1-lr_scalingsqrt', 'results/study/report/data/fmnist-mlp-scaling-9.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr_scalinglinear-reductionsum', 'results/study/report/data/fmnist-mlp-scaling-10.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr_scalingnone-reductionsum', 'results/study/report/data/fmnist-mlp-scaling-11.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr_scalingsqrt-reductionsum'
set terminal svg size 1100,600 font 'sans,11' noenhanced
set output 'results/study/report/fmnist-mlp-efficiency.svg'
set grid
set logscale x 2
set xrange [0.8333333333333334:9.6]
set xlabel 'replicas'
set key outside right top
set title 'fmnist-mlp: scaling efficiency'
set ylabel 'efficiency (%)'
set yrange [0:*]
plot 100 with lines dt 2 lc 'gray' title 'ideal', 'results/study/report/data/fmnist-mlp-scaling-0.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.025-lr_scalinglinear', 'results/study/report/data/fmnist-mlp-scaling-1.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.025-lr_scalingnone', 'results/study/report/data/fmnist-mlp-scaling-2.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.025-lr_scalingsqrt', 'results/study/report/data/fmnist-mlp-scaling-3.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.05-lr_scalinglinear', 'results/study/report/data/fmnist-mlp-scaling-4.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.05-lr_scalingnone', 'results/study/report/data/fmnist-mlp-scaling-5.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.05-lr_scalingsqrt', 'results/study/report/data/fmnist-mlp-scaling-6.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.1-lr_scalinglinear', 'results/study/report/data/fmnist-mlp-scaling-7.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.1-lr_scalingnone', 'results/study/report/data/fmnist-mlp-scaling-8.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr0.1-lr_scalingsqrt', 'results/study/report/data/fmnist-mlp-scaling-9.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr_scalinglinear-reductionsum', 'results/study/report/data/fmnist-mlp-scaling-10.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr_scalingnone-reductionsum', 'results/study/report/data/fmnist-mlp-scaling-11.dat' using 1:3 with linespoints lw 2 pt 7 title 'lr_scalingsqrt-reductionsum'
set output
